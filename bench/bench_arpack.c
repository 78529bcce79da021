/* bench_arpack.c — ARPACK's dsaupd on the Gram matrix of an f32 matrix, for the bench (see
 * bench_arpack.h). The products are two OpenBLAS sgemv on the f32 matrix, as scipy's svds
 * does them through numpy, so that ARPACK gets the BLAS the library is measured against. */
#include "config.h"

#include "bench_arpack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cblas.h>

#include "clock.h"
#include "synth.h"

#ifdef HAVE_ARPACK
/* ARPACK's Fortran entry points (gfortran: arguments by reference, the lengths of the
 * character arguments appended). */
extern void dsaupd_(int *ido, const char *bmat, int *n, const char *which, int *nev, double *tol,
                    double *resid, int *ncv, double *v, int *ldv, int *iparam, int *ipntr,
                    double *workd, double *workl, int *lworkl, int *info, size_t bmat_len,
                    size_t which_len);
extern void dseupd_(int *rvec, const char *howmny, int *select, double *d, double *z, int *ldz,
                    double *sigma, const char *bmat, int *n, const char *which, int *nev,
                    double *tol, double *resid, int *ncv, double *v, int *ldv, int *iparam,
                    int *ipntr, double *workd, double *workl, int *lworkl, int *info,
                    size_t howmny_len, size_t bmat_len, size_t which_len);

int arpack_available(void) { return 1; }

int arpack_sigma(const float *w, size_t rows, size_t cols, double tol, double *sigma, int *reads,
                 double *seconds)
{
  /* the smaller Gram matrix, as svds chooses: W^T W (cols) when cols <= rows, else W W^T */
  const int right = cols <= rows;
  int n = (int)(right ? cols : rows), other = (int)(right ? rows : cols);
  int nev = 1, ncv = n < 20 ? n : 20, ldv = n, lworkl = ncv * (ncv + 8), info = 0, ido = 0;
  int iparam[11] = {0}, ipntr[11] = {0};
  double *resid = malloc((size_t)n * sizeof *resid);
  double *v = malloc((size_t)n * (size_t)ncv * sizeof *v);
  double *workd = malloc(3 * (size_t)n * sizeof *workd);
  double *workl = malloc((size_t)lworkl * sizeof *workl);
  float *x = malloc((size_t)n * sizeof *x), *t = malloc((size_t)other * sizeof *t);
  float *y = malloc((size_t)n * sizeof *y);
  int *select = malloc((size_t)ncv * sizeof *select);
  int rc = -1, products = 0;
  if (!resid || !v || !workd || !workl || !x || !t || !y || !select) {
    fprintf(stderr, "arpack: out of memory\n");
    goto out;
  }
  /* a seeded start (info = 1): ARPACK's own random start moves on at every call, so that the
   * ladder's runs (and their repeats) would each start elsewhere */
  synth_rng rng;
  synth_seed(&rng, 0x5eed);
  for (int i = 0; i < n; i++)
    resid[i] = synth_normal(&rng);
  info = 1;
  iparam[0] = 1;      /* exact shifts */
  iparam[2] = 10 * n; /* maxiter, scipy's default */
  iparam[6] = 1;      /* mode 1: A x = lambda x */
  double t0 = monotonic_seconds();
  for (;;) {
    dsaupd_(&ido, "I", &n, "LA", &nev, &tol, resid, &ncv, v, &ldv, iparam, ipntr, workd, workl,
            &lworkl, &info, 1, 2);
    if (ido != 1 && ido != -1)
      break;
    const double *in = workd + ipntr[0] - 1;
    double *outv = workd + ipntr[1] - 1;
    for (int i = 0; i < n; i++)
      x[i] = (float)in[i];
    /* right: t = W x, y = W^T t; else t = W^T x, y = W t (row-major rows x cols) */
    cblas_sgemv(CblasRowMajor, right ? CblasNoTrans : CblasTrans, (int)rows, (int)cols, 1.0f, w,
                (int)cols, x, 1, 0.0f, t, 1);
    cblas_sgemv(CblasRowMajor, right ? CblasTrans : CblasNoTrans, (int)rows, (int)cols, 1.0f, w,
                (int)cols, t, 1, 0.0f, y, 1);
    for (int i = 0; i < n; i++)
      outv[i] = y[i];
    products++;
  }
  if (info < 0 || info > 1) {
    fprintf(stderr, "arpack: dsaupd info %d\n", info);
    goto out;
  }
  int rvec = 0, ierr = 0;
  double d[2] = {0.0, 0.0}, shift = 0.0;
  dseupd_(&rvec, "A", select, d, v, &ldv, &shift, "I", &n, "LA", &nev, &tol, resid, &ncv, v, &ldv,
          iparam, ipntr, workd, workl, &lworkl, &ierr, 1, 1, 2);
  double t1 = monotonic_seconds();
  if (ierr != 0) {
    fprintf(stderr, "arpack: dseupd info %d\n", ierr);
    goto out;
  }
  *sigma = sqrt(fmax(d[0], 0.0));
  *reads = 2 * products;
  *seconds = t1 - t0;
  rc = info == 1 ? -1 : 0; /* info 1: maxiter ran out */
  if (info == 1)
    fprintf(stderr, "arpack: maxiter reached at tol %g\n", tol);
out:
  free(resid);
  free(v);
  free(workd);
  free(workl);
  free(x);
  free(t);
  free(y);
  free(select);
  return rc;
}
#else
int arpack_available(void) { return 0; }

int arpack_sigma(const float *w, size_t rows, size_t cols, double tol, double *sigma, int *reads,
                 double *seconds)
{
  (void)w, (void)rows, (void)cols, (void)tol, (void)sigma, (void)reads, (void)seconds;
  return -1;
}
#endif
