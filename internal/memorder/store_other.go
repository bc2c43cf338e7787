//go:build !amd64

package memorder

import "sync/atomic"

// StoreRelease stores v into *p with (at least) release order: a core that
// loads v from *p (with acquire order, as atomic.LoadUint64) sees every
// store this goroutine made before. Here it is atomic.StoreUint64, which is
// stronger. p must be 8-byte aligned.
func StoreRelease(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
