package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/goep/goep/ep"
)

// listBackends prints, for -device list, every registered backend: its
// name, aliases, what it is and the features it declares.
func listBackends(w io.Writer) {
	for _, b := range ep.Backends() {
		name := b.Name
		if len(b.Aliases) > 0 {
			name += " (" + strings.Join(b.Aliases, ", ") + ")"
		}
		fmt.Fprintf(w, "%s\n    %s\n", name, b.Doc)
		features := make([]string, len(b.Features))
		for i, f := range b.Features {
			features[i] = f.String()
		}
		if len(features) == 0 {
			features = []string{"none"}
		}
		fmt.Fprintf(w, "    features: %s\n", strings.Join(features, "; "))
	}
}
