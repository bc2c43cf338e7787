package moe

import (
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// dense views data as a row-major rows x cols matrix for gonum's BLAS.
func dense(rows, cols int, data []float64) blas64.General {
	return blas64.General{Rows: rows, Cols: cols, Stride: cols, Data: data}
}

// gemm is c = alpha*op(a)*op(b) + beta*c, skipped when a dimension is zero.
func gemm(tA, tB blas.Transpose, alpha float64, a, b blas64.General, beta float64, c blas64.General) {
	if c.Rows == 0 || c.Cols == 0 {
		return
	}
	blas64.Gemm(tA, tB, alpha, a, b, beta, c)
}

// grow returns s resized to n elements, reusing its storage when it can.
// The contents are unspecified.
func grow(s []float64, n int) []float64 {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]float64, n)
}

// mlpCache holds one expert's forward pass over n rows, for its backward.
type mlpCache struct {
	n int
	u []float64 // [n][H] inputs
	a []float64 // [n][F] pre-activations
	h []float64 // [n][F] activations
	o []float64 // [n][H] outputs
}

// mlpForward runs expert e on the n rows of c.u: o = act(u·W1 + b1)·W2 + b2.
func mlpForward(e expert, act Activation, H, F int, c *mlpCache) {
	n := c.n
	c.a, c.h, c.o = grow(c.a, n*F), grow(c.h, n*F), grow(c.o, n*H)
	for i := 0; i < n; i++ {
		copy(c.a[i*F:(i+1)*F], e.b1)
		copy(c.o[i*H:(i+1)*H], e.b2)
	}
	gemm(blas.NoTrans, blas.NoTrans, 1, dense(n, H, c.u), dense(H, F, e.w1), 1, dense(n, F, c.a))
	for i, v := range c.a {
		c.h[i] = activate(act, v)
	}
	gemm(blas.NoTrans, blas.NoTrans, 1, dense(n, F, c.h), dense(F, H, e.w2), 1, dense(n, H, c.o))
}

// mlpBackward adds the gradients of expert e's parameters for the output
// gradient gO ([n][H]) into g, and writes the gradient of its inputs into du
// ([n][H]). scratch is reused between calls.
func mlpBackward(e, g expert, act Activation, H, F int, c *mlpCache, gO, du []float64, scratch *[]float64) {
	n := c.n
	if n == 0 {
		return
	}
	// Output layer: dW2 += h^T gO, db2 += column sums of gO.
	gemm(blas.Trans, blas.NoTrans, 1, dense(n, F, c.h), dense(n, H, gO), 1, dense(F, H, g.w2))
	colSums(g.b2, gO, n, H)
	// Through the activation: da = (gO W2^T) * act'(a).
	*scratch = grow(*scratch, n*F)
	da := *scratch
	gemm(blas.NoTrans, blas.Trans, 1, dense(n, H, gO), dense(F, H, e.w2), 0, dense(n, F, da))
	for i, v := range c.a {
		da[i] *= activateGrad(act, v)
	}
	// Input layer: dW1 += u^T da, db1 += column sums of da, du = da W1^T.
	gemm(blas.Trans, blas.NoTrans, 1, dense(n, H, c.u), dense(n, F, da), 1, dense(H, F, g.w1))
	colSums(g.b1, da, n, F)
	gemm(blas.NoTrans, blas.Trans, 1, dense(n, F, da), dense(H, F, e.w1), 0, dense(n, H, du))
}

// colSums adds the column sums of m ([n][cols]) into dst.
func colSums(dst, m []float64, n, cols int) {
	for i := 0; i < n; i++ {
		row := m[i*cols : (i+1)*cols]
		for j, v := range row {
			dst[j] += v
		}
	}
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// activate is SiLU(x) = x*sigmoid(x) or GELU(x) = x*Phi(x).
func activate(act Activation, x float64) float64 {
	if act == GELU {
		return 0.5 * x * (1 + math.Erf(x/math.Sqrt2))
	}
	return x * sigmoid(x)
}

// activateGrad is the derivative of activate at x.
func activateGrad(act Activation, x float64) float64 {
	if act == GELU {
		const invSqrt2Pi = 0.3989422804014327 // 1/sqrt(2*pi)
		return 0.5*(1+math.Erf(x/math.Sqrt2)) + x*invSqrt2Pi*math.Exp(-0.5*x*x)
	}
	s := sigmoid(x)
	return s * (1 + x*(1-s))
}
