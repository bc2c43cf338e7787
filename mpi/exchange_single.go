//go:build !mpi

package mpi

// Exchange is a set of non-blocking sends and receives in flight. In a
// build without MPI there is one rank and no peer: only an empty Exchange
// can be made.
type Exchange struct{}

// Exchange refuses every message: a job of one rank has no peer.
func (c *Comm) Exchange(sends, recvs []Message) (*Exchange, error) {
	if err := c.checkUsable("Exchange"); err != nil {
		return nil, err
	}
	if err := c.checkMessages("Exchange", sends, recvs); err != nil {
		return nil, err
	}
	return &Exchange{}, nil
}

// Test reports that the (empty) exchange is complete.
func (x *Exchange) Test() (bool, error) { return true, nil }

// Pending is empty.
func (x *Exchange) Pending() []int { return nil }

// Cancel does nothing.
func (x *Exchange) Cancel() (sendsLeft bool) { return false }
