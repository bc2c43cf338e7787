// Command gen writes the files that come from the kernels' signatures
// (kernels.Generated): run by go generate in gpu/internal/kernels.
package main

import (
	"fmt"
	"os"

	"github.com/goep/goep/gpu/internal/kernels"
)

func main() {
	files, err := kernels.Generated()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for path, b := range files {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
