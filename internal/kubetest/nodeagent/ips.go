package nodeagent

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// IPs hands out Pod IPs.
type IPs interface {
	Allocate() (netip.Addr, error)
	Release(netip.Addr)
}

// loopbackIPs allocates 127.0.x.y, from 127.0.0.2 upward, to Pods: Linux
// routes all of 127/8 to lo, so each Pod listens on an address of its own
// without a network namespace. An address is held by an flock on a file
// named after it in a 0700 directory of this user's, so that agents in
// other test processes (go test runs packages in parallel) never hand out
// the same address, and a crashed process's addresses come free with it.
type loopbackIPs struct {
	dir string

	mu   sync.Mutex
	held map[netip.Addr]*os.File
}

var (
	sharedIPsOnce sync.Once
	sharedIPs     *loopbackIPs
	sharedIPsErr  error
)

// LoopbackIPs returns the process-wide loopback allocator.
func LoopbackIPs() (IPs, error) {
	sharedIPsOnce.Do(func() {
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("stoke-nodeagent-ips-%d", os.Getuid()))
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			sharedIPsErr = err
			return
		}
		var st unix.Stat_t
		if err := unix.Lstat(dir, &st); err != nil {
			sharedIPsErr = err
			return
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Getuid() || st.Mode&0o077 != 0 {
			sharedIPsErr = fmt.Errorf("pod IP lock directory %s: not a 0700 directory of ours", dir)
			return
		}
		sharedIPs = &loopbackIPs{dir: dir, held: map[netip.Addr]*os.File{}}
	})
	if sharedIPsErr != nil {
		return nil, fmt.Errorf("pod IPs: %w", sharedIPsErr)
	}
	return sharedIPs, nil
}

func (l *loopbackIPs) Allocate() (netip.Addr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for n := 2; n < 1<<16-1; n++ {
		a := netip.AddrFrom4([4]byte{127, 0, byte(n >> 8), byte(n)})
		if n&0xff == 0 || n&0xff == 0xff {
			continue
		}
		if _, ok := l.held[a]; ok {
			continue
		}
		f, err := os.OpenFile(filepath.Join(l.dir, a.String()), os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("pod IPs: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue // another process holds it
		}
		l.held[a] = f
		return a, nil
	}
	return netip.Addr{}, errors.New("pod IPs: 127.0.0.0/16 exhausted")
}

func (l *loopbackIPs) Release(a netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.held[a]; ok {
		f.Close() // releases the lock
		delete(l.held, a)
	}
}
