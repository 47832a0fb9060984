// bench: tables A-D of docs/benchmarks.md in one run on the GPU. Ceilings first (device copy and
// a cuBLAS bf16 matrix product), then attention (A), the pipeline step (B), kernels alone (C) and
// executor warm-up (D); a short table at the end and every record in --json. Table S (the step
// staging's host work) needs no GPU: it runs first, and alone where there is no device.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/kernels/synthetic_front/synthetic_front.hpp"
#include "samples/bench/bench_attention.hpp"
#include "samples/bench/bench_kernels.hpp"
#include "samples/bench/bench_pipeline.hpp"
#include "samples/bench/bench_staging.hpp"
#include "samples/bench/bench_step.hpp"
#include "samples/bench/probes.hpp"
#include "samples/bench/report.hpp"

namespace {

using namespace spg;

void measure_ceilings(bench::Reporter& rep, cudaStream_t stream) {
  const std::size_t bytes = std::size_t{2} << 30;
  core::DeviceBuffer a(bytes);
  core::DeviceBuffer b(bytes);
  SPG_CUDA_TRY(kernels::SyntheticFront::fill_query(static_cast<__nv_bfloat16*>(a.data()), bytes / 2, 1, 0, stream));
  const double copy_us = bench::median_gpu_us(
      stream, [&] { SPG_CUDA_TRY(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream)); },
      {3, 20});
  rep.add({"ceilings", "copy", "cudaMemcpy", "gbps", 2.0 * static_cast<double>(bytes) / copy_us / 1e3});

  const int n = 8192;
  const std::size_t elems = std::size_t{1} * n * n;
  core::DeviceBuffer x(elems * 2);
  core::DeviceBuffer y(elems * 2);
  core::DeviceBuffer z(elems * 2);
  SPG_CUDA_TRY(kernels::SyntheticFront::fill_query(static_cast<__nv_bfloat16*>(x.data()), elems, 2, 0, stream));
  SPG_CUDA_TRY(kernels::SyntheticFront::fill_query(static_cast<__nv_bfloat16*>(y.data()), elems, 3, 0, stream));
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) throw Error("bench: cublasCreate failed");
  cublasSetStream(handle, stream);
  const float alpha = 1.0F;
  const float beta = 0.0F;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  const double gemm_us = bench::median_gpu_us(
      stream,
      [&] {
        st = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, x.data(), CUDA_R_16BF, n, y.data(),
                          CUDA_R_16BF, n, &beta, z.data(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      },
      {3, 20});
  cublasDestroy(handle);
  if (st != CUBLAS_STATUS_SUCCESS) throw Error("bench: cublasGemmEx failed");
  rep.add({"ceilings", "gemm-bf16-8192", "cublas", "tflops", 2.0 * n * static_cast<double>(n) * n / gemm_us / 1e6});
  std::printf("  ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", rep.value("ceilings", "copy", "cudaMemcpy", "gbps"),
              rep.value("ceilings", "gemm-bf16-8192", "cublas", "tflops"));
}

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  std::string tables = "ABCD";
  std::string dump;
  std::string rows;
  std::string paths;
  int rounds = 1;
  int s_q = 0;
  int s_kv = 0;
  int splits = 0;
  int staging_reps = 20000;
  bool quick = false;
  bool burst = false;
  std::string launch = "oneshot";
  bool ceilings = true;
  bool checksum = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--tables" && i + 1 < argc) {
      tables = argv[++i];
    } else if (a == "--dump" && i + 1 < argc) {
      dump = argv[++i];
    } else if (a == "--rows" && i + 1 < argc) {
      rows = argv[++i];
    } else if (a == "--paths" && i + 1 < argc) {
      paths = argv[++i];
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
      if (rounds < 1) {
        std::fprintf(stderr, "bench: --rounds needs a count of at least 1\n");
        return 2;
      }
    } else if (a == "--s-q" && i + 1 < argc) {
      s_q = std::atoi(argv[++i]);
      if (s_q < 1 || s_q > 65536) {
        std::fprintf(stderr, "bench: --s-q needs a token count in [1, 65536]\n");
        return 2;
      }
    } else if (a == "--s-kv" && i + 1 < argc) {
      s_kv = std::atoi(argv[++i]);
      if (s_kv < 1 || s_kv > (1 << 22)) {
        std::fprintf(stderr, "bench: --s-kv needs a kv row count in [1, 4194304]\n");
        return 2;
      }
    } else if (a == "--splits" && i + 1 < argc) {
      splits = std::atoi(argv[++i]);
      if (splits < 0 || splits > 256) {
        std::fprintf(stderr, "bench: --splits needs a slice count in [0, 256] (0: the shape's choice)\n");
        return 2;
      }
    } else if (a == "--staging-reps" && i + 1 < argc) {
      staging_reps = std::atoi(argv[++i]);
      if (staging_reps < 1) {
        std::fprintf(stderr, "bench: --staging-reps needs a count of at least 1\n");
        return 2;
      }
    } else if (a == "--launch" && i + 1 < argc) {
      launch = argv[++i];
      if (launch != "oneshot" && launch != "prepared" && launch != "chain" && launch != "gated") {
        std::fprintf(stderr, "bench: --launch takes oneshot, prepared, chain or gated, not '%s'\n", launch.c_str());
        return 2;
      }
    } else if (a == "--no-ceilings") {
      ceilings = false;
    } else if (a == "--checksum") {
      checksum = true;
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--burst") {
      burst = true;
    } else if (a == "--help" || a == "-h") {
      std::printf("usage: bench [--tables ABCDSLR] [--quick] [--rows TEXT] [--paths LIST] [--rounds N] [--burst] [--launch MODE] [--s-q N] [--s-kv N] [--splits N] [--no-ceilings] [--checksum] [--staging-reps N] [--json FILE]\n"
                  "  --tables   which of tables A (attention), B (pipeline), C (kernels), D (executor), S (step staging,\n"
                  "             host only, no GPU needed), L (table D's property and loop probes alone), R (where a step graph's\n"
                  "             growing launch cost is paid) to run; - for none\n"
                  "  --quick    fewer rows and repetitions\n"
                  "  --rows     table A: only the rows whose name contains TEXT, or one of a comma-separated list\n"
                  "             (e.g. V4-C2/32768, sq256, V32/8192,sq64)\n"
                  "  --paths    table A: time these SparseMlaPath names on every row (comma-separated, e.g.\n"
                  "             automatic,single_pass,split_topk,split_dv; split and split_dv on small chunks only)\n"
                  "  --rounds   table A: time each row's variants N times in rotating order (median of the rounds)\n"
                  "  --burst    table A: time each kernel after 10 (small rows) or 3 warm-up calls only, not after 25 ms\n"
                  "             of warm-up and over at least 100 ms (the long rows measure up to 12%% faster so)\n"
                  "  --launch   table A: oneshot (SparseMla::run per call, default), prepared (initialize once,\n"
                  "             SparseMlaLaunch::run per call), chain (prepared, 8 back-to-back launches per sample)\n"
                  "             or gated (prepared, each sample enqueued behind a gate the host opens after it:\n"
                  "             the kernel's device time from an idle start, without the host's launch)\n"
                  "  --s-q N    table A: every row with N tokens instead of its own (named .../sqN, no FlashMLA\n"
                  "             figure): the wave probe, e.g. V4-C1 at 4092 (31 waves of 132 CTAs) against 4096\n"
                  "  --s-kv N   table A: every row over N kv rows instead of its own (named .../kvN, no FlashMLA\n"
                  "             figure): the L2 probe, e.g. V4-C1/8192 at 24576 rows (24 MiB) against 32768\n"
                  "  --splits N table A: N top-k slices on the split paths instead of the shape's choice\n"
                  "  --no-ceilings  skip the copy and GEMM ceilings (2 s; for repeated A/B invocations in one run)\n"
                  "  --checksum table A: after timing each (row, variant), one more launch and a checksum of its out,\n"
                  "             max_logits and lse, printed (\"checksum ROW VARIANT 0x...\") and recorded: builds that\n"
                  "             must compute the same bits compare equal (scripts/attention_ab_bins.sh --checksum)\n"
                  "  --staging-reps  table S: repetitions per row (default 20000; median of them)\n"
                  "  --json     write every record to FILE\n"
                  "  --dump DIR write the small workload's inputs and outputs to DIR (for scripts/torch_peer.py --check)\n");
      return 0;
    } else {
      std::fprintf(stderr, "bench: unknown or incomplete flag '%s' (see --help)\n", a.c_str());
      return 2;
    }
  }
  try {
    bench::Reporter rep;
    const auto write_json = [&] {
      if (json.empty()) return;
      const char* commit = std::getenv("SPGRAPH_COMMIT");
      const std::time_t t = std::time(nullptr);
      char date[16];
      std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&t));
      rep.write_json(json, commit != nullptr ? commit : "unknown", date);
    };
    if (tables.find('S') != std::string::npos) bench::run_staging_benchmarks(rep, staging_reps);
    const bool device_work = tables.find_first_not_of("S-") != std::string::npos || !dump.empty();
    if (!device_work || !core::cuda_device_available()) {
      // Table S alone, or no device for the rest.
      const bool staged = tables.find('S') != std::string::npos;
      if (device_work) {
        std::printf(staged ? "bench: no CUDA device found; only table S measured.\n"
                           : "bench: no CUDA device found; nothing to measure.\n");
      }
      if (staged) rep.print_table("staging");
      write_json();
      return 0;
    }
    if (!dump.empty()) {
      bench::dump_small_workload(dump);
      if (tables == "-") return 0;
    }
    core::Stream stream;
    if (ceilings) measure_ceilings(rep, stream.get());
    if (tables.find('A') != std::string::npos) {
      bench::AttentionOptions attention;
      attention.quick = quick;
      attention.rows = rows;
      attention.burst = burst;
      attention.paths = paths;
      attention.rounds = rounds;
      attention.launch = launch;
      attention.s_q = s_q;
      attention.s_kv = s_kv;
      attention.num_splits = splits;
      attention.checksum = checksum;
      bench::run_attention_benchmarks(rep, stream.get(), attention);
    }
    if (tables.find('B') != std::string::npos) bench::run_pipeline_benchmarks(rep, quick);
    if (tables.find('C') != std::string::npos) bench::run_kernel_benchmarks(rep, stream.get());
    if (tables.find('D') != std::string::npos) {
      bench::run_executor_benchmarks(rep);
      bench::run_launch_probe(rep);
      bench::run_step_benchmarks(rep);
    } else if (tables.find('L') != std::string::npos) {
      bench::run_property_probes(rep);  // part of table D
      bench::run_loop_probe(rep);      // part of table D
    }
    if (tables.find('R') != std::string::npos) bench::run_relaunch_probe(rep);
    for (const char* suite : {"staging", "ceilings", "attention", "pipeline", "kernels", "executor"}) rep.print_table(suite);
    write_json();
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench: %s\n", e.what());
    return 1;
  }
}
