package h5_test

import (
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/goep/goep/internal/h5"
)

// A training loop's trace: one row per step, appended to a table and flushed,
// so that a killed run leaves a readable file; then read back.
func Example() {
	dir, err := os.MkdirTemp("", "h5example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "trace.h5")

	f, err := h5.Create(path)
	if err != nil {
		log.Fatal(err)
	}
	if err := f.SetAttr("", "experts", 8); err != nil {
		log.Fatal(err)
	}
	// Each row: step, loss, tokens dropped.
	trace, err := f.CreateTable("trace/step", h5.Float64, []int{3}, 0)
	if err != nil {
		log.Fatal(err)
	}
	for step := range 4 {
		loss := 2.0 / float64(step+1)
		if err := trace.Append([]float64{float64(step), loss, 0}); err != nil {
			log.Fatal(err)
		}
		if err := f.Flush(); err != nil {
			log.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		log.Fatal(err)
	}

	f, err = h5.Open(path)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	rows, shape, err := f.ReadFloat64("trace/step")
	if err != nil {
		log.Fatal(err)
	}
	experts, err := f.AttrInt64("", "experts")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("experts:", experts)
	fmt.Println("shape:", shape)
	for r := range shape[0] {
		fmt.Println(rows[r*3 : r*3+3])
	}
	// Reading with the wrong type is an error, never garbage.
	_, _, err = f.ReadFloat32("trace/step")
	fmt.Println(errors.Is(err, h5.ErrType))
	// Output:
	// experts: 8
	// shape: [4 3]
	// [0 2 0]
	// [1 1 0]
	// [2 0.6666666666666666 0]
	// [3 0.5 0]
	// true
}
