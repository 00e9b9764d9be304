// Fork-join over the cores for the CPU decode kernels (`cpu_gemv.cc`, `cpu_attention.cc`).
//
// A decode step calls these kernels every few microseconds. Waking a sleeping thread
// costs more than a small matvec, and scheduling on XLA's intra-op pool measured
// slower, so the kernels share helper threads of their own that wait for the next job
// by spinning for a while (2 ms) and then sleep. They spin with sched_yield, not a
// pause: when XLA's own pool runs a large op between two kernel calls (a batch-32
// GEMM), a pause-spinning helper holds a core against it (measured: the batch-32 step
// 25% slower), a yielding one hands the core over. Work is split in blocks that go to
// whichever thread asks first (the caller included), so a late helper never delays a
// call; which block a thread computes never changes the result.

#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace pipo {

typedef float v8f __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));  // unaligned load
  return v;
}

inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }

inline float hsum(v8f v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// Blocks [0, blocks) of one call, claimed by whichever thread asks first. Shared-owned,
// so a helper that picks it up after the call returned finds nothing left and touches
// nothing but this struct.
struct Job {
  std::function<void(int64_t)> body;
  int64_t blocks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> finished{0};

  void run() {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < blocks;) {
      body(i);
      finished.fetch_add(1, std::memory_order_release);
    }
  }
};

class Helpers {
 public:
  explicit Helpers(int64_t count) {
    for (int64_t i = 0; i < count; ++i) std::thread([this] { loop(); }).detach();
  }
  void submit(const std::shared_ptr<Job>& job) {
    std::atomic_store(&current_, job);
    generation_.fetch_add(1);
    if (sleeping_.load() > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
      int spins = 0;
      while (generation_.load() == seen) {
        std::this_thread::yield();
        if (++spins % 1024 == 0 && std::chrono::steady_clock::now() > deadline) {
          std::unique_lock<std::mutex> lock(mu_);
          sleeping_.fetch_add(1);
          cv_.wait(lock, [&] { return generation_.load() != seen; });
          sleeping_.fetch_sub(1);
        }
      }
      seen = generation_.load();
      if (auto job = std::atomic_load(&current_)) job->run();
    }
  }
  std::shared_ptr<Job> current_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleeping_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

// Below this many bytes of operands a call runs on the calling thread alone (handing
// work to another thread costs more than it saves).
constexpr int64_t kMinParallelBytes = 256 * 1024;

// Runs body(0..blocks-1) over `threads` threads (the caller and threads - 1 helpers,
// created at the first parallel call and shared by every kernel of the library), or on
// the caller alone when the call reads fewer than kMinParallelBytes.
inline void parallel_for(int64_t threads, int64_t bytes, int64_t blocks, std::function<void(int64_t)> body) {
  if (threads <= 1 || blocks <= 1 || bytes < kMinParallelBytes) {
    for (int64_t i = 0; i < blocks; ++i) body(i);
    return;
  }
  static Helpers* helpers = new Helpers(threads - 1);  // never destroyed: threads outlive exit
  auto job = std::make_shared<Job>();
  job->body = std::move(body);
  job->blocks = blocks;
  helpers->submit(job);
  job->run();
  while (job->finished.load(std::memory_order_acquire) < job->blocks) std::this_thread::yield();
}

}  // namespace pipo
