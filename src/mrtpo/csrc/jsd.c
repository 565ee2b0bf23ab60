/* Fused Jensen–Shannon divergence rows on the CPU (mrtpo.fused builds and loads this file).

   For rows r of two logit blocks zp, zq ([rows, V], float32 or bfloat16, row strides ldp, ldq), with the
   logit transform z -> softcap(scale * (z + bias)) applied on the fly:

     lse(z)   = max_v z_v + log sum_v exp(z_v - max)                 (pass 1: one read of the block)
     JSD_nats = 1/2 sum_v [p_v log1p(a_v) + q_v log1p(-a_v)],  a = tanh((log p - log q) / 2)
                                                                     (pass 2: one read of both blocks)

   the cancellation-free form of mrtpo.distance (every term >= 0 up to rounding). Pass 1 walks each row
   in blocks of BLK values kept in L1: block maximum, then the block's exp-sum against the running
   maximum (an online log-sum-exp: the row is read from memory once). Pass 2 walks p's and q's rows
   together. No [rows, V] buffer is written.

   Built with -ffast-math so that expf/tanhf/log1pf vectorize (glibc's libmvec); the code therefore never
   lets an inf or NaN reach arithmetic: values are classified by their bits when loaded, -inf (a
   probability of exactly 0) becomes NEG (exp(NEG - lse) == 0, tanh of the difference == +-1), and a
   row holding +inf or NaN is reported (its lse is set to NaN by bits) so the caller returns NaN. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define BLK 1024
#define NEG (-1.0e30f)

typedef struct {
  const void *zp, *zq;
  int64_t ldp, ldq, rows, vocab;
  const float *bias;
  float scale, cap;
  int bf16, nthreads;
  float *lse_p, *lse_q; /* [2, rows]: row maxima, then log of the exp-sums against them; pass 1
                           writes lse_p (lse_q unused), pass 2 reads both */
  double *out;
  int64_t r0, r1;
} job_t;

static inline uint32_t bits_of(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float float_of(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* Row r of z, values [v0, v0 + n), transformed into buf; returns 1 if one is +inf or NaN. Counts in
   *neg the values that are -inf. */
static int load_block(const void *z, int64_t ld, int bf16, int64_t r, int64_t v0, int64_t n,
                      const float *bias, float scale, float cap, float *buf, int64_t *neg) {
  if (bf16) {
    const uint16_t *src = (const uint16_t *)z + r * ld + v0;
    for (int64_t i = 0; i < n; i++) buf[i] = float_of((uint32_t)src[i] << 16);
  } else {
    memcpy(buf, (const float *)z + r * ld + v0, (size_t)n * sizeof(float));
  }
  int bad = 0;
  int64_t nneg = 0;
  for (int64_t i = 0; i < n; i++) { /* classify before any arithmetic */
    uint32_t u = bits_of(buf[i]);
    int special = (u & 0x7f800000u) == 0x7f800000u;
    int minus_inf = u == 0xff800000u;
    bad |= special & !minus_inf;
    nneg += minus_inf;
    buf[i] = special ? NEG : buf[i];
  }
  if (bias || scale != 1.0f || cap > 0.0f) {
    for (int64_t i = 0; i < n; i++) {
      float x = buf[i];
      float t = (x == NEG) ? NEG : (x + (bias ? bias[v0 + i] : 0.0f)) * scale;
      buf[i] = t;
    }
    if (cap > 0.0f) {
      float inv = 1.0f / cap;
      for (int64_t i = 0; i < n; i++) buf[i] = cap * tanhf(buf[i] * inv);
    }
    for (int64_t i = 0; i < n; i++) { /* a finite value may have overflowed in the transform */
      uint32_t u = bits_of(buf[i]);
      int special = (u & 0x7f800000u) == 0x7f800000u;
      bad |= special & (u != 0xff800000u);
      buf[i] = special ? NEG : buf[i];
    }
  }
  *neg += nneg;
  return bad;
}

static void *lse_rows(void *arg) {
  job_t *j = (job_t *)arg;
  float buf[BLK];
  for (int64_t r = j->r0; r < j->r1; r++) {
    float m = NEG;
    double s = 0.0;
    int bad = 0;
    int64_t neg = 0;
    for (int64_t v0 = 0; v0 < j->vocab; v0 += BLK) {
      int64_t n = j->vocab - v0 < BLK ? j->vocab - v0 : BLK;
      bad |= load_block(j->zp, j->ldp, j->bf16, r, v0, n, j->bias, j->scale, j->cap, buf, &neg);
      float bm = NEG;
      for (int64_t i = 0; i < n; i++) bm = buf[i] > bm ? buf[i] : bm;
      if (bm > m) {
        s *= exp((double)m - (double)bm);
        m = bm;
      }
      float bs = 0.0f;
      for (int64_t i = 0; i < n; i++) bs += expf(buf[i] - m);
      s += (double)bs;
    }
    /* +inf/NaN anywhere, or every probability 0 (all -inf): NaN, as log_softmax gives. The maximum and
       log-sum are kept apart: log p = (z - max) - log-sum is exact near the maximum even when the
       logits are large, where max + log-sum rounded to float would shift every log p by its rounding */
    j->lse_p[r] = (bad || neg == j->vocab) ? float_of(0x7fc00000u) : m;
    j->lse_p[j->rows + r] = (float)log(s);
  }
  return NULL;
}

static void *terms_rows(void *arg) {
  job_t *j = (job_t *)arg;
  float bp[BLK], bq[BLK];
  const float a_max = 1.0f - 5.9604645e-08f; /* 1 - eps/2 (float32 eps = 2^-23) */
  for (int64_t r = j->r0; r < j->r1; r++) {
    uint32_t up = bits_of(j->lse_p[r]), uq = bits_of(j->lse_q[r]);
    if ((up & 0x7f800000u) == 0x7f800000u || (uq & 0x7f800000u) == 0x7f800000u) {
      j->out[r] = (double)float_of(0x7fc00000u);
      continue;
    }
    float mp = j->lse_p[r], lsp = j->lse_p[j->rows + r];
    float mq = j->lse_q[r], lsq = j->lse_q[j->rows + r];
    double t = 0.0;
    int64_t neg = 0;
    for (int64_t v0 = 0; v0 < j->vocab; v0 += BLK) {
      int64_t n = j->vocab - v0 < BLK ? j->vocab - v0 : BLK;
      load_block(j->zp, j->ldp, j->bf16, r, v0, n, j->bias, j->scale, j->cap, bp, &neg);
      load_block(j->zq, j->ldq, j->bf16, r, v0, n, j->bias, j->scale, j->cap, bq, &neg);
      /* z - max in a loop of its own (stored), so that reassociation cannot fold max and log-sum */
      for (int64_t i = 0; i < n; i++) bp[i] -= mp;
      for (int64_t i = 0; i < n; i++) bq[i] -= mq;
      /* each entry's p log1p(a) + q log1p(-a) is stored before the sum: with reassociation allowed
         the compiler could otherwise add its two parts to the running sum separately */
      for (int64_t i = 0; i < n; i++) {
        /* the larger log-probability first: the entry is the same function of (p, q) and (q, p) */
        float lp = bp[i] - lsp, lq = bq[i] - lsq;
        float hi = lp > lq ? lp : lq, lo = lp > lq ? lq : lp;
        float a = tanhf(0.5f * (hi - lo)); /* >= 0 */
        a = a > a_max ? a_max : a;
        bp[i] = expf(hi) * log1pf(a) + expf(lo) * log1pf(-a);
      }
      float bt = 0.0f;
      for (int64_t i = 0; i < n; i++) bt += bp[i];
      t += (double)bt;
    }
    j->out[r] = 0.5 * t;
  }
  return NULL;
}

static void run(job_t *base, void *(*fn)(void *)) {
  int nt = base->nthreads < 1 ? 1 : base->nthreads;
  if (nt > 64) nt = 64;
  if (nt > base->rows) nt = (int)(base->rows > 0 ? base->rows : 1);
  job_t jobs[64];
  pthread_t tids[64];
  int64_t per = (base->rows + nt - 1) / nt;
  for (int i = 0; i < nt; i++) {
    jobs[i] = *base;
    jobs[i].r0 = i * per;
    jobs[i].r1 = (i + 1) * per < base->rows ? (i + 1) * per : base->rows;
  }
  for (int i = 1; i < nt; i++)
    if (pthread_create(&tids[i], NULL, fn, &jobs[i]) != 0) fn(&jobs[i]), tids[i] = 0;
  fn(&jobs[0]);
  for (int i = 1; i < nt; i++)
    if (tids[i]) pthread_join(tids[i], NULL);
}

/* lse[0, r] = max_v z[r, v] and lse[1, r] = log sum_v exp(z[r, v] - lse[0, r]) of the transformed rows of
   z ([rows, V], row stride ld); lse is [2, rows]. */
void mrtpo_lse(const void *z, int64_t ld, int64_t rows, int64_t vocab, int bf16, const float *bias,
               float scale, float cap, float *lse, int nthreads) {
  job_t j = {z, NULL, ld, 0, rows, vocab, bias, scale, cap, bf16, nthreads, lse, NULL, NULL, 0, rows};
  run(&j, lse_rows);
}

/* out[r] = JSD in nats of rows r of zp and zq given their lse pairs (NaN where a maximum is NaN). */
void mrtpo_jsd(const void *zp, int64_t ldp, const void *zq, int64_t ldq, int64_t rows, int64_t vocab,
               int bf16, const float *bias, float scale, float cap, float *lse_p, float *lse_q,
               double *out, int nthreads) {
  job_t j = {zp, zq, ldp, ldq, rows, vocab, bias, scale, cap, bf16, nthreads, lse_p, lse_q, out, 0, rows};
  run(&j, terms_rows);
}
