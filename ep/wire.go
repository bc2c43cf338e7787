package ep

// DecodeRows writes into dst the values of rows of hidden elements that
// travelled in format w (as RecvWire gives them: rows of w's RowBytes,
// scales of its SideBytes each), by the format's definition (WireInfo.Decode).
// It is for reading and checking rows, not a fast path: Dequantize is the
// fast one for the FP8 formats.
func DecodeRows(w WireFormat, dst []float32, rows, scales []byte, hidden int) error {
	const op = "DecodeRows"
	info, ok := w.Info()
	switch {
	case !ok || info.Decode == nil:
		return inputErrorf(op, "format %v has no definition to decode by (its rows are the element type)", w)
	case hidden <= 0 || len(dst)%hidden != 0:
		return inputErrorf(op, "len(dst) = %d is not a multiple of hidden = %d", len(dst), hidden)
	}
	if info.CheckHidden != nil {
		if err := info.CheckHidden(hidden); err != nil {
			return inputErrorf(op, "format %v: %v", w, err)
		}
	}
	n := len(dst) / hidden
	rb, sb := info.RowBytes(hidden, 1), info.SideBytes(hidden)
	if len(rows) != n*rb || len(scales) != n*sb {
		return inputErrorf(op, "%d rows of %v take %d bytes and %d of scales; got %d and %d", n, w, n*rb, n*sb, len(rows), len(scales))
	}
	for r := 0; r < n; r++ {
		info.Decode(dst[r*hidden:(r+1)*hidden], rows[r*rb:(r+1)*rb], scales[r*sb:(r+1)*sb])
	}
	return nil
}
