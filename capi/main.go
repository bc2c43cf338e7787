//go:build mpi

package main

// main is never run: the package is built as a C library (-buildmode=c-shared
// or c-archive), whose entry points are the exported functions.
func main() {}
