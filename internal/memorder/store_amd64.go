package memorder

// StoreRelease stores v into *p with release order: a core that loads v
// from *p (with acquire order, as atomic.LoadUint64) sees every store this
// goroutine made before. It does not wait for the store to reach other
// cores. p must be 8-byte aligned.
//
//go:noescape
func StoreRelease(p *uint64, v uint64)
