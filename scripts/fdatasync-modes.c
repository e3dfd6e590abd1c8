/* fdatasync latency and CPU of 8 KB appends, per file preparation
 * (issue 20 goal 2, docs/BENCHMARKS.md "Per-batch cost of a confirmed
 * publish"): "grow" appends to an empty file (its size changes at every
 * sync), "zero" overwrites a file pre-written with zeros and synced,
 * "falloc" writes into fallocate'd (unwritten) extents.
 *
 *   gcc -O2 -o /tmp/fdatasync-modes scripts/fdatasync-modes.c
 *   flock /tmp/berth-bench.lock /tmp/fdatasync-modes grow|zero|falloc FILE COUNT BYTES
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <sys/resource.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static double cpu(){struct rusage r;getrusage(RUSAGE_SELF,&r);return r.ru_utime.tv_sec*1e6+r.ru_utime.tv_usec+r.ru_stime.tv_sec*1e6+r.ru_stime.tv_usec;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  const char*mode=argv[1]; const char*path=argv[2]; int n=atoi(argv[3]); size_t bs=atoi(argv[4]);
  size_t total=(size_t)n*bs+(1<<20);
  unlink(path);
  int fd=open(path,O_RDWR|O_CREAT|O_TRUNC,0644); if(fd<0){perror("open");return 1;}
  char*buf=aligned_alloc(4096,1<<20); memset(buf,0,1<<20);
  if(!strcmp(mode,"zero")){ for(size_t o=0;o<total;o+=1<<20) pwrite(fd,buf,1<<20,o); fdatasync(fd);}
  else if(!strcmp(mode,"falloc")){ if(fallocate(fd,0,0,total)) perror("fallocate"); fdatasync(fd);}
  memset(buf,'x',bs);
  double*lat=malloc(sizeof(double)*n); double c0=cpu(),t0=now();
  for(int i=0;i<n;i++){ double a=now(); pwrite(fd,buf,bs,(off_t)i*bs); if(fdatasync(fd)) perror("fdatasync"); lat[i]=now()-a; }
  double el=now()-t0,cc=cpu()-c0;
  qsort(lat,n,sizeof(double),cmp);
  printf("%-7s n=%d bs=%zu  p50 %.0f us  p90 %.0f p99 %.0f  mean %.0f us  cpu/op %.1f us\n",mode,n,bs,lat[n/2],lat[n*9/10],lat[n*99/100],el/n,cc/n);
  close(fd); unlink(path); return 0;}
