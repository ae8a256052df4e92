// Package wfexpr is a WorkflowRun's ${{ }} expression language as GitHub
// Actions defines it: expressions are parsed with actionlint's lexer and
// parser (github.com/rhysd/actionlint), and evaluated here over its syntax
// tree with GitHub's loose equality, truthiness, string and number
// coercion, object filters and built-in functions. It also expands a job's
// strategy.matrix (include and exclude as GitHub's) and names its
// instances "id (v1, v2)".
//
// It evaluates; it never runs anything. Values reach a step's program in
// environment variables, never spliced into its source (the engine's job).
package wfexpr
