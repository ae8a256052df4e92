// Command stoke-container-init is the node agent's container init (see
// package containerinit). The agent builds and starts it; nothing else
// should.
package main

import (
	"os"

	"stoke.dev/stoke/internal/kubetest/nodeagent/containerinit"
)

func main() { os.Exit(containerinit.Main()) }
