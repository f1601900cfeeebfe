// Rational-quadratic spline (forward and inverse, linear tails or circular) as one CPU kernel per direction.
//
// The maths is that of flowkit/kernels/fused.py (`_fused_forward`, `_fused_backward`), point by point:
// per point the bin logits are exponentiated once, the searched axis's knots are accumulated for the bin
// search, and only the bin's two knots and two derivatives enter the bin arithmetic. The backward pass
// recomputes the point's bin from the inputs (cheaper than saving it) and writes the point's whole row of
// parameter cotangents. Built on first use by `flowkit.kernels.native` with torch's extension loader.

#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <tuple>

namespace {

// The most bins the kernel takes (its per-point tables live on the stack); more go through PyTorch.
constexpr int64_t kMaxBins = 128;
// Derivatives at the knots are capped here, as in transformers/rational_quadratic.py (`MAX_DERIVATIVE`).
constexpr double kMaxDerivative = 1e12;
// Points per task of the parallel loop.
constexpr int64_t kGrain = 256;

struct Layout {
  int64_t bins;
  double low, high, min_derivative;
  bool circular;
  // per axis (widths, heights), from the minimum bin width and height m: span m and span (1 - K m), formed in
  // double and rounded once as torch does with a Python scalar
  double span_min[2], span_free[2];
};

// torch's softplus (beta 1, threshold 20) in the storage type `S` (float's exp and log are several times
// faster than double's, and glibc's log1pf than either): log1p(z) = z log(u) / (u - 1) with u = 1 + z rounded
// (Goldberg's identity, accurate to a few units in the last place).
template <typename S>
S softplus(S x) {
  if (x > S(20)) return x;
  const S z = std::exp(x);
  const S u = S(1) + z;
  return u == S(1) ? z : std::log(u) * (z / (u - S(1)));
}

template <typename S>
S softplus_slope(S x) {  // its derivative, as torch's softplus_backward
  if (x > S(20)) return S(1);
  const S z = std::exp(x);
  return z / (z + S(1));
}

// One point's spline: the bin, its knots and derivatives, and the terms of the bin's map.
template <typename T>
struct Point {
  // cumulative sums of the exponentiated, shifted logits of the widths (a = 0) and heights (a = 1)
  // (sums[a][j]: the first j + 1), and the scale span (1 - K m) / C_K of each axis
  std::array<std::array<T, kMaxBins>, 2> sums;
  std::array<T, 2> scale;
  int64_t bin;
  bool inside;
  T x0, x1, y0, y1, d0, d1;
  T w, h, s, c, xi, one_m_xi, q, den, n, p, log_derivative, solved;
  // the bin's two derivatives before the cap (`softened`) and their pre-softplus columns (`raw`, where
  // `has_raw`: not at the linear tails' ends)
  std::array<T, 2> raw, softened;
  std::array<bool, 2> has_raw;
};

template <typename T>
T knot(const Layout& L, const Point<T>& pt, int a, int64_t j) {
  // knot j >= 1 of axis a: offset_{j-1} + C_{j-1} scale, offset_{j-1} = j span m + low (as `SplineLayout.scale_and_offset`)
  if (j == 0) return T(L.low);
  return (T(j) * T(L.span_min[a]) + T(L.low)) + pt.sums[a][j - 1] * pt.scale[a];
}

// The point's bin and the terms of its map, computed in `T` (double for float storage `S`) from the row of
// parameters `row` (column stride `col_stride`) and its exponentiated logits `exps` (`exponentiate`).
template <typename T, typename S>
void evaluate(const Layout& L, const S* row, int64_t col_stride, const S* exps, S v, bool inverse, Point<T>& pt) {
  const int64_t K = L.bins;
  // accumulated in double, as torch's CPU cumsum does for float; the two axes interleaved (two independent
  // chains of additions)
  double widths = 0, heights = 0;
  for (int64_t j = 0; j < K; ++j) {
    widths += double(exps[j]);
    heights += double(exps[K + j]);
    pt.sums[0][j] = T(widths);
    pt.sums[1][j] = T(heights);
  }
  for (int a = 0; a < 2; ++a) pt.scale[a] = T(L.span_free[a]) / pt.sums[a][K - 1];
  // clamped in the storage type, against the bounds rounded to it, as torch's clamp does (float32's pi lies
  // outside double's)
  const S stored = std::min(std::max(v, S(L.low)), S(L.high));
  pt.inside = v == stored;
  const T clamped = T(stored);
  const int axis = inverse ? 1 : 0;
  // the bin: the number of interior knots of the searched axis strictly below the point, counted as
  // torch.searchsorted does (a NaN point or knot counts as below: the last bin)
  int64_t bin = 0;
  for (int64_t j = 1; j < K; ++j) bin += !(knot(L, pt, axis, j) >= clamped);  // no data-dependent branch
  pt.bin = bin;
  pt.x0 = knot(L, pt, 0, bin);
  pt.x1 = knot(L, pt, 0, bin + 1);
  pt.y0 = knot(L, pt, 1, bin);
  pt.y1 = knot(L, pt, 1, bin + 1);
  T d[2];
  for (int e = 0; e < 2; ++e) {
    // derivative at knot j: 1 at the linear tails' ends, else m_d + softplus of its column
    // (the circle's knot 0 shares the last column with knot K)
    const int64_t j = bin + e;
    int64_t column = -1;
    if (L.circular) {
      column = j == 0 ? K - 1 : j - 1;
    } else if (j != 0 && j != K) {
      column = j - 1;
    }
    const bool has = column >= 0;
    const S stored = has ? row[(2 * K + column) * col_stride] : S(0);
    const T r = T(stored);
    const T value = has ? T(softplus(stored)) + T(L.min_derivative) : T(1);
    pt.raw[e] = r;
    pt.has_raw[e] = has;
    pt.softened[e] = value;
    d[e] = std::min(value, T(kMaxDerivative));
  }
  pt.d0 = d[0];
  pt.d1 = d[1];
  pt.w = pt.x1 - pt.x0;
  pt.h = pt.y1 - pt.y0;
  pt.s = pt.h / pt.w;
  pt.c = pt.d0 + pt.d1 - (pt.s + pt.s);
  T xi;
  if (inverse) {
    // a = h (s - d0) + dy c and b = h d0 - dy c (`_solve_bin`), with c = d0 + d1 - 2s written out:
    // b = d0 (h - dy) - dy (d1 - 2s), a = h s - b, free of the cancellation of h d0 against dy d0 in a steep
    // bin (where torch's fused multiply-add saves the PyTorch path, and plain arithmetic would lose digits)
    const T dy = clamped - pt.y0;
    const T qb = pt.d0 * (pt.h - dy) - dy * (pt.d1 - (pt.s + pt.s));
    const T qa = pt.h * pt.s - qb;
    const T s_dy = pt.s * dy;
    const T root = std::sqrt(std::max(qb * qb + T(4) * (qa * s_dy), T(0)));
    const bool positive = qb >= T(0);
    const T numerator = positive ? s_dy + s_dy : root - qb;
    const T denominator = std::max(positive ? qb + root : qa + qa, std::numeric_limits<T>::min());
    xi = std::min(std::max(numerator / denominator, T(0)), T(1));
    // torch.lerp: exactly x0 at 0 and x1 at 1
    pt.solved = xi < T(0.5) ? pt.x0 + xi * pt.w : pt.x1 - pt.w * (T(1) - xi);
  } else {
    xi = std::min(std::max((clamped - pt.x0) / pt.w, T(0)), T(1));
    pt.solved = clamped;
  }
  pt.xi = xi;
  pt.one_m_xi = T(1) - xi;
  const T xi_sq = xi * xi;
  pt.q = xi * pt.one_m_xi;
  pt.den = pt.s + pt.c * pt.q;
  pt.n = pt.s * xi_sq + pt.d0 * pt.q;
  pt.p = pt.d1 * xi_sq + (pt.s + pt.s) * pt.q + pt.d0 * pt.one_m_xi * pt.one_m_xi;
  // the log in the storage type (float's is twice as fast; the ratio is rounded once, 6e-8 relative)
  pt.log_derivative = T(std::log(S(pt.s * pt.s * pt.p / (pt.den * pt.den))));
}

template <typename T>
T dp_dxi(const Point<T>& pt) {
  return T(2) * (pt.d1 * pt.xi + pt.s * (pt.one_m_xi - pt.xi) - pt.d0 * pt.one_m_xi);
}

template <typename T>
T dlog_dx(const Point<T>& pt, T dp) {
  return (dp / pt.p - T(2) * pt.c * (pt.one_m_xi - pt.xi) / pt.den) / pt.w;
}

// `_bin_vjp`: cotangents of (y, log dy/dx) pulled back to (x, x0, x1, y0, y1, d0, d1).
template <typename T>
std::array<T, 7> bin_vjp(const Point<T>& pt, T dp, T g_y, T g_log) {
  const T one_m_2xi = pt.one_m_xi - pt.xi;
  const T g_n = g_y * pt.h / pt.den;
  const T g_den = -(g_n * pt.n + T(2) * g_log) / pt.den;
  const T g_p = g_log / pt.p;
  const T g_xi = g_n * (T(2) * pt.s * pt.xi + pt.d0 * one_m_2xi) + g_den * pt.c * one_m_2xi + g_p * dp;
  const T g_s = g_n * pt.xi * pt.xi + g_den * (T(1) - T(2) * pt.q) + T(2) * g_p * pt.q + T(2) * g_log / pt.s;
  const T g_d0 = (g_n + g_den) * pt.q + g_p * pt.one_m_xi * pt.one_m_xi;
  const T g_d1 = g_den * pt.q + g_p * pt.xi * pt.xi;
  const T g_h = g_y * pt.n / pt.den + g_s / pt.w;
  const T g_w = -(g_s * pt.s + g_xi * pt.xi) / pt.w;
  const T g_x = g_xi / pt.w;
  return {g_x, -g_x - g_w, g_w, g_y - g_h, g_h, g_d0, g_d1};
}

// The exponentiated logits `2^((l - max) log2 e)` of every row's widths and heights, `(n, 2K)`: the shift
// per point and axis here, the powers in one vectorised pass of torch's `exp2` (several times faster than
// a scalar `exp` per logit).
template <typename T>
at::Tensor exponentiate(const T* pp, int64_t rs, int64_t cs, int64_t n, int64_t K, const at::TensorOptions& options) {
  at::Tensor z = at::empty({n, 2 * K}, options);
  T* zp = z.mutable_data_ptr<T>();
  const T log2e = T(1.4426950408889634);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* row = pp + i * rs;
      T* out = zp + i * 2 * K;
      for (int a = 0; a < 2; ++a) {
        const T* logits = row + a * K * cs;
        T top = logits[0];
        for (int64_t j = 1; j < K; ++j) top = std::max(top, logits[j * cs]);
        for (int64_t j = 0; j < K; ++j) out[a * K + j] = (logits[j * cs] - top) * log2e;
      }
    }
  });
  return z.exp2_();
}

Layout make_layout(int64_t bins, double low, double high, double min_width, double min_height,
                   double min_derivative, bool circular) {
  TORCH_CHECK(bins >= 1 && bins <= kMaxBins, "flowkit native spline: bins must lie in [1, ", kMaxBins, "]");
  const double span = high - low;
  return Layout{bins,
                low,
                high,
                min_derivative,
                circular,
                {span * min_width, span * min_height},
                {span * (1 - double(bins) * min_width), span * (1 - double(bins) * min_height)}};
}

void check_inputs(const at::Tensor& v, const at::Tensor& params, const Layout& L) {
  TORCH_CHECK(v.device().is_cpu() && params.device().is_cpu(), "flowkit native spline: CPU tensors only");
  TORCH_CHECK(v.dim() == 1 && params.dim() == 2 && params.size(0) == v.size(0),
              "flowkit native spline: expected v (n,) and params (n, P)");
  TORCH_CHECK(v.scalar_type() == params.scalar_type(), "flowkit native spline: v and params differ in dtype");
  const int64_t need = L.circular ? 3 * L.bins : 3 * L.bins - 1;
  TORCH_CHECK(params.size(1) >= need, "flowkit native spline: params has ", params.size(1), " columns, needs ",
              need);
}

// Outputs (out, ladj, dlog, exps): dlog is empty unless `derivative`; exps are the exponentiated logits
// (`exponentiate`), which the backward pass takes back instead of recomputing them.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rqs_forward(
    const at::Tensor& v_in, const at::Tensor& params, int64_t bins, double low, double high, double min_width,
    double min_height, double min_derivative, bool circular, bool inverse, bool derivative) {
  const Layout L = make_layout(bins, low, high, min_width, min_height, min_derivative, circular);
  check_inputs(v_in, params, L);
  const at::Tensor v = v_in.contiguous();
  const int64_t n = v.size(0);
  at::Tensor out = at::empty({n}, v.options());
  at::Tensor ladj = at::empty({n}, v.options());
  at::Tensor dlog = at::empty({derivative ? n : 0}, v.options());
  at::Tensor exps;
  AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "flowkit_rqs_forward", [&] {
    using T = scalar_t;
    using A = at::acc_type<T, false>;  // the arithmetic: double for float (steep bins amplify rounding)
    const T* vp = v.const_data_ptr<T>();
    const T* pp = params.const_data_ptr<T>();
    const int64_t rs = params.stride(0), cs = params.stride(1);
    T* op = out.mutable_data_ptr<T>();
    T* lp = ladj.mutable_data_ptr<T>();
    T* dp = derivative ? dlog.mutable_data_ptr<T>() : nullptr;
    exps = exponentiate(pp, rs, cs, n, bins, v.options());
    const T* ep = exps.const_data_ptr<T>();
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      Point<A> pt;
      for (int64_t i = begin; i < end; ++i) {
        evaluate(L, pp + i * rs, cs, ep + i * 2 * bins, vp[i], inverse, pt);
        const A L0 = pt.log_derivative;
        A o = inverse ? pt.solved : pt.y0 + pt.h * pt.n / pt.den;
        A l = inverse ? -L0 : L0;
        A dl = A(0);
        if (derivative) {
          dl = dlog_dx(pt, dp_dxi(pt));
          if (inverse) dl = -dl * std::exp(-L0);
        }
        if (!circular && !pt.inside) {
          o = A(vp[i]);
          l = A(0);
          dl = A(0);
        }
        op[i] = T(o);
        lp[i] = T(l);
        if (derivative) dp[i] = T(dl);
      }
    });
  });
  return {out, ladj, dlog, exps};
}

// Cotangents of (out, ladj) pulled back to (v, params); `exps` from `rqs_forward` on the same inputs.
std::tuple<at::Tensor, at::Tensor> rqs_backward(const at::Tensor& v_in, const at::Tensor& params,
                                                const at::Tensor& exps, const at::Tensor& g_out_in,
                                                const at::Tensor& g_ladj_in, int64_t bins, double low,
                                                double high, double min_width, double min_height,
                                                double min_derivative, bool circular,
                                                bool inverse, bool need_params) {
  const Layout L = make_layout(bins, low, high, min_width, min_height, min_derivative, circular);
  check_inputs(v_in, params, L);
  const int64_t n = v_in.size(0), width = params.size(1), K = bins;
  TORCH_CHECK(exps.device().is_cpu() && exps.is_contiguous() && exps.dim() == 2 && exps.size(0) == n &&
                  exps.size(1) == 2 * K && exps.scalar_type() == v_in.scalar_type(),
              "flowkit native spline: exps must be rqs_forward's, (n, 2 bins) and contiguous");
  TORCH_CHECK(g_out_in.device().is_cpu() && g_ladj_in.device().is_cpu() && g_out_in.numel() == n &&
                  g_ladj_in.numel() == n,
              "flowkit native spline: g_out and g_ladj must be CPU tensors of n elements");
  const at::Tensor v = v_in.contiguous();
  const at::Tensor g_out = g_out_in.to(v.scalar_type()).contiguous();
  const at::Tensor g_ladj = g_ladj_in.to(v.scalar_type()).contiguous();
  at::Tensor g_v = at::empty({n}, v.options());
  at::Tensor g_params = at::empty({need_params ? n : 0, width}, v.options());
  AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "flowkit_rqs_backward", [&] {
    using T = scalar_t;
    using A = at::acc_type<T, false>;
    const T* vp = v.const_data_ptr<T>();
    const T* pp = params.const_data_ptr<T>();
    const T* go = g_out.const_data_ptr<T>();
    const T* gl = g_ladj.const_data_ptr<T>();
    const int64_t rs = params.stride(0), cs = params.stride(1);
    T* gv = g_v.mutable_data_ptr<T>();
    T* gp = need_params ? g_params.mutable_data_ptr<T>() : nullptr;
    const T* ep = exps.const_data_ptr<T>();
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      Point<A> pt;
      for (int64_t i = begin; i < end; ++i) {
        T* grow = need_params ? gp + i * width : nullptr;
        if (need_params) std::fill(grow, grow + width, T(0));
        const T* row_exps = ep + i * 2 * K;
        evaluate(L, pp + i * rs, cs, row_exps, vp[i], inverse, pt);
        if (!circular && !pt.inside) {  // the identity tail: no parameter enters
          gv[i] = go[i];
          continue;
        }
        const A dp = dp_dxi(pt);
        const A g_o = A(go[i]), g_l = A(gl[i]);
        std::array<A, 7> g;
        if (!inverse) {
          g = bin_vjp(pt, dp, g_o, g_l);
        } else {
          // x = tau^{-1}(v): dx/dv = e^{-L}, dx/dtheta = -e^{-L} dtau/dtheta, and ladj = -L(x)
          const A g_vv = (g_o - g_l * dlog_dx(pt, dp)) * (pt.den * pt.den / (pt.s * pt.s * pt.p));
          g = bin_vjp(pt, dp, -g_vv, -g_l);
          g[0] = g_vv;
        }
        gv[i] = pt.inside ? T(g[0]) : T(0);
        if (!need_params) continue;
        // knots: lower knot `bin` (constant at 0), upper knot `bin + 1` (constant at K); knot j of axis a
        // moves with logit l as scale e_l ([l < j] - F_j), F_j = C_j / C_K
        const int64_t lo = pt.bin, hi = pt.bin + 1;
        for (int a = 0; a < 2; ++a) {
          const A g0 = lo == 0 ? A(0) : g[1 + 2 * a];
          const A g1 = hi == K ? A(0) : g[2 + 2 * a];
          const A total = pt.sums[a][K - 1];
          const A f0 = lo == 0 ? A(0) : pt.sums[a][lo - 1] / total;
          const A f1 = pt.sums[a][hi - 1] / total;
          const A base = -(g0 * f0 + g1 * f1);
          const A factor = pt.scale[a];
          T* g_logits = grow + a * K;
          for (int64_t l = 0; l < K; ++l) {
            const A spike = base + (l < lo ? g0 : A(0)) + (l < hi ? g1 : A(0));
            g_logits[l] = T(factor * A(row_exps[a * K + l]) * spike);
          }
        }
        for (int e = 0; e < 2; ++e) {  // the two derivatives, through their softplus (none where capped)
          if (!pt.has_raw[e] || pt.softened[e] > A(kMaxDerivative)) continue;
          const int64_t j = pt.bin + e;
          const int64_t column = circular ? (j == 0 ? K - 1 : j - 1) : j - 1;
          grow[2 * K + column] += T(g[5 + e] * A(softplus_slope(T(pt.raw[e]))));
        }
      }
    });
  });
  return {g_v, g_params};
}

}  // namespace

TORCH_LIBRARY(flowkit_native, m) {
  m.def(
      "rqs_forward(Tensor v, Tensor params, int bins, float low, float high, float min_width, float min_height, "
      "float min_derivative, bool circular, bool inverse, bool derivative) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "rqs_backward(Tensor v, Tensor params, Tensor exps, Tensor g_out, Tensor g_ladj, int bins, float low, float high, "
      "float min_width, float min_height, float min_derivative, bool circular, bool inverse, bool need_params) "
      "-> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(flowkit_native, CPU, m) {
  m.impl("rqs_forward", &rqs_forward);
  m.impl("rqs_backward", &rqs_backward);
}
