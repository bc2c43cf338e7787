package kernels

import (
	"fmt"
	"regexp"
	"strings"
)

// Param is one parameter of a kernel, as the .cu source declares it.
type Param struct {
	Name string // the source's name, e.g. dst_rows
	C    string // its C type, e.g. "const i32 *"
	Slot byte   // p: a device address, l: a 64-bit integer, i: a 32-bit int
}

// Signature is a kernel's entry point as the .cu source declares it.
type Signature struct {
	Name   string
	File   string
	Params []Param
}

// Letters is the parameters' slot letters, as Kernel.Params spells them.
func (s Signature) Letters() string {
	b := make([]byte, len(s.Params))
	for i, p := range s.Params {
		b[i] = p.Slot
	}
	return string(b)
}

var kernelDecl = regexp.MustCompile(`(?s)GOEP_KERNEL\s+(\w+)\s*\(([^)]*)\)`)

// Signatures parses every GOEP_KERNEL declaration of the sources, in the
// order they are compiled: the one place a kernel's parameters are written,
// from which the launch table (List), the emulator's dispatch (emulate.c)
// and the Go side's argument packing come (go generate; TestTablesAreCurrent
// fails where they drifted).
func Signatures() ([]Signature, error) {
	var out []Signature
	for _, f := range Files {
		text, err := File(f)
		if err != nil {
			return nil, err
		}
		for _, m := range kernelDecl.FindAllStringSubmatch(text, -1) {
			sig := Signature{Name: m[1], File: f}
			for _, raw := range strings.Split(m[2], ",") {
				p, err := parseParam(strings.Join(strings.Fields(raw), " "))
				if err != nil {
					return nil, fmt.Errorf("kernels: %s in %s: %w", m[1], f, err)
				}
				sig.Params = append(sig.Params, p)
			}
			out = append(out, sig)
		}
	}
	return out, nil
}

// parseParam splits "const i32 *dst_idx" into its type and name and gives
// it its slot letter.
func parseParam(s string) (Param, error) {
	i := strings.LastIndexAny(s, " *")
	if i < 0 {
		return Param{}, fmt.Errorf("parameter %q has no type", s)
	}
	p := Param{Name: s[i+1:], C: strings.TrimSpace(s[:i+1])}
	switch {
	case strings.Contains(p.C, "*"):
		p.Slot = 'p'
	case p.C == "i64" || p.C == "u64":
		p.Slot = 'l'
	case p.C == "int" || p.C == "i32" || p.C == "u32" || p.C == "unsigned":
		p.Slot = 'i'
	default:
		return Param{}, fmt.Errorf("parameter %q: type %q is not a pointer, i64, u64, int, i32 or u32", s, p.C)
	}
	return p, nil
}
