package driver

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultBackend is the backend a Config without one runs on: the CPU
// engine.
const DefaultBackend = "cpu"

// Registration is a backend that programs open by name: ep-bench's and
// moe-train's -device, moe-serve's, and anything that calls ep.OpenBackend.
// Open receives the options that followed the name; it must refuse, by
// name, any it does not know (BackendOptions.Done).
type Registration struct {
	Name    string   // as Backend.Name says with default options: "cpu", "gpu:cuda"
	Aliases []string // other names it answers to ("cuda")
	Doc     string   // one line: what it is, and its options
	Open    func(BackendOptions) (Backend, error)
}

var registry struct {
	sync.Mutex
	regs  []Registration
	names map[string]int // name or alias -> index in regs
}

// Register makes a backend reachable by its name and aliases. A
// backend package calls it from init; a name or alias taken twice, an empty
// one, one with a comma (which starts the options) or a missing Open is a
// programming error, and panics.
func Register(r Registration) {
	registry.Lock()
	defer registry.Unlock()
	if registry.names == nil {
		registry.names = map[string]int{}
	}
	if r.Open == nil {
		panic(fmt.Sprintf("ep: Register %q without Open", r.Name))
	}
	for _, n := range append([]string{r.Name}, r.Aliases...) {
		if n == "" || strings.ContainsAny(n, ", =") {
			panic(fmt.Sprintf("ep: Register: name %q is empty or has a comma, space or '='", n))
		}
		if _, dup := registry.names[n]; dup {
			panic(fmt.Sprintf("ep: Register: %q is registered twice", n))
		}
		registry.names[n] = len(registry.regs)
	}
	registry.regs = append(registry.regs, r)
}

// Open opens the backend spec names: a registered name or alias,
// then options as comma-separated key=value pairs ("gpu:cuda,device=1").
// An unknown name is an error that lists the registered ones; an option the
// backend does not take is an error that names it.
func Open(spec string) (Backend, error) {
	name, rest, _ := strings.Cut(strings.TrimSpace(spec), ",")
	registry.Lock()
	i, ok := registry.names[name]
	var r Registration
	if ok {
		r = registry.regs[i]
	}
	registry.Unlock()
	if !ok {
		return nil, fmt.Errorf("ep: backend %q is not registered: want one of %s (a program links the GPU backends by importing github.com/goep/goep/ep/backends)",
			name, strings.Join(backendNames(), ", "))
	}
	opts := BackendOptions{backend: r.Name, values: map[string]string{}, used: map[string]bool{}}
	if rest != "" {
		for _, kv := range strings.Split(rest, ",") {
			k, v, ok := strings.Cut(kv, "=")
			k = strings.TrimSpace(k)
			if !ok || k == "" {
				return nil, fmt.Errorf("ep: backend %q: option %q is not key=value", spec, kv)
			}
			if _, dup := opts.values[k]; dup {
				return nil, fmt.Errorf("ep: backend %q: option %q given twice", spec, k)
			}
			opts.values[k] = strings.TrimSpace(v)
		}
	}
	b, err := r.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("ep: backend %q: %w", spec, err)
	}
	return b, nil
}

// BackendInfo is a registered backend as Backends lists it: what it can do
// comes from the features it declares with its default options.
type BackendInfo struct {
	Name     string
	Aliases  []string
	Doc      string
	Features []Feature
}

// Backends lists the registered backends, by name.
func Backends() []BackendInfo {
	registry.Lock()
	regs := slices.Clone(registry.regs)
	registry.Unlock()
	sort.Slice(regs, func(i, j int) bool { return regs[i].Name < regs[j].Name })
	out := make([]BackendInfo, 0, len(regs))
	for _, r := range regs {
		info := BackendInfo{Name: r.Name, Aliases: slices.Clone(r.Aliases), Doc: r.Doc}
		if b, err := r.Open(BackendOptions{backend: r.Name}); err == nil {
			for _, f := range Features() {
				if Supports(b, f) {
					info.Features = append(info.Features, f)
				}
			}
		}
		out = append(out, info)
	}
	return out
}

// backendNames are the registered names, sorted.
func backendNames() []string {
	registry.Lock()
	defer registry.Unlock()
	names := make([]string, 0, len(registry.regs))
	for _, r := range registry.regs {
		names = append(names, r.Name)
	}
	sort.Strings(names)
	return names
}

// BackendOptions are the options of an ep.OpenBackend spec, for the backend's
// Open: each getter takes its key and a default, and Done refuses the keys
// no getter asked for.
type BackendOptions struct {
	backend string
	values  map[string]string
	used    map[string]bool
}

// String is the option key's value, or def where absent.
func (o BackendOptions) String(key, def string) string {
	v, ok := o.values[key]
	if !ok {
		return def
	}
	o.used[key] = true
	return v
}

// Int is the option key as an integer, or def where absent.
func (o BackendOptions) Int(key string, def int) (int, error) {
	return parseOption(o, key, def, "an integer", strconv.Atoi)
}

// Bool is the option key as a boolean (strconv.ParseBool), or def where
// absent.
func (o BackendOptions) Bool(key string, def bool) (bool, error) {
	return parseOption(o, key, def, "true or false", strconv.ParseBool)
}

// Duration is the option key as a duration ("2ms"), or def where absent.
func (o BackendOptions) Duration(key string, def time.Duration) (time.Duration, error) {
	return parseOption(o, key, def, "a duration", time.ParseDuration)
}

// parseOption is the option key read by parse, or def where absent; what
// names what parse accepts, for the error.
func parseOption[T any](o BackendOptions, key string, def T, what string, parse func(string) (T, error)) (T, error) {
	v, ok := o.values[key]
	if !ok {
		return def, nil
	}
	o.used[key] = true
	x, err := parse(v)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("option %s=%q is not %s", key, v, what)
	}
	return x, nil
}

// Done is an error naming the options no getter asked for, and the ones
// the backend takes (known), or nil.
func (o BackendOptions) Done(known ...string) error {
	var extra []string
	for k := range o.values {
		if !o.used[k] {
			extra = append(extra, k)
		}
	}
	if len(extra) == 0 {
		return nil
	}
	sort.Strings(extra)
	takes := "no options"
	if len(known) > 0 {
		takes = "only " + strings.Join(known, ", ")
	}
	return fmt.Errorf("%s does not take option(s) %s: it takes %s", o.backend, strings.Join(extra, ", "), takes)
}

// NoOptions is the Open of a backend b that takes no options.
func NoOptions(b Backend) func(BackendOptions) (Backend, error) {
	return func(o BackendOptions) (Backend, error) { return b, o.Done() }
}
