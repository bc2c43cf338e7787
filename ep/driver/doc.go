// Package driver is the contract between package ep and the engines that
// move its rows, as database/sql/driver is for database/sql: what a Backend
// opens (an Engine for one Group), the records of a call it is handed
// (Dispatch, Combine, Received, Routing), the optional interfaces a
// Backend's features need (Refuser, Meter, Masker, ...), and the vocabulary
// both sides share (Config, its modes, layouts and wire formats, Tensor and
// Memory, the errors).
//
// Programs use package ep, which names all of this too; a backend imports
// driver and never ep, so that ep can link the backends without a cycle. A
// new backend implements Backend and Engine, declares the Features it
// implements (Capable), registers itself with ep.RegisterBackend, and
// proves itself with the conformance suite of package ep/eptest.
//
// Config's methods that resolve its defaults and derived sizes
// (ResolvedLayout, MaxRecv, Alignment, ...) are here so that ep and every
// engine read a Config the same way.
package driver
