// The `cpu` backend's persistent thread pool: worker threads started on first use (as many as
// the largest call has asked for, STRIDEATTN_CPU_THREADS or the machine's cores) and reused by
// every later call, so a call costs a wake-up instead of thread creation. The caller always
// runs slot 0 itself and never waits for a slot no worker has picked up: when it finishes,
// unclaimed slots are withdrawn (bodies pull work from a shared counter, so whoever runs
// drains it). A call therefore completes even when no worker exists (thread creation failed,
// or the process forked), and concurrent calls from several threads share the workers.
#include <condition_variable>
#include <deque>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_common.hpp"

namespace strideattn::detail::cpu {
namespace {

class Pool {
 public:
  bool run(int slots, const std::function<void(int)>& body) {
    Job job{&body, slots};
    if (slots > 1) {
      std::lock_guard<std::mutex> lock(mu_);
      start_workers(slots - 1);
      jobs_.push_back(&job);
    }
    if (slots > 1) work_cv_.notify_all();
    run_slot(job, 0);
    if (slots > 1) {
      std::unique_lock<std::mutex> lock(mu_);
      withdraw(&job);  // slots nobody has claimed yet are not run
      done_cv_.wait(lock, [&] { return job.running == 0; });
    }
    return !job.failed;
  }

 private:
  struct Job {
    const std::function<void(int)>* body;
    int slots;
    int next_slot = 1;  // slot 0 is the caller's
    int running = 0;    // workers inside body (guarded by mu_)
    bool failed = false;
  };

  // Under mu_: grows the pool to `n` workers (never shrinks). A thread that cannot be
  // started leaves its slots to the threads that did start.
  void start_workers(int n) {
    while (static_cast<int>(threads_.size()) < n) {
      try {
        threads_.emplace_back([this] { worker(); });
      } catch (const std::system_error&) {
        return;
      } catch (const std::bad_alloc&) {
        return;
      }
    }
  }

  // Under mu_.
  void withdraw(Job* job) {
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it)
      if (*it == job) {
        jobs_.erase(it);
        return;
      }
  }

  // An exception must not leave a thread (std::terminate); it is reported as failure.
  void run_slot(Job& job, int slot) {
    bool ok = true;
    try {
      (*job.body)(slot);
    } catch (...) {
      ok = false;
    }
    if (!ok) {
      std::lock_guard<std::mutex> lock(mu_);
      job.failed = true;
    }
  }

  void worker() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return !jobs_.empty(); });
      Job* job = jobs_.front();
      const int slot = job->next_slot++;
      if (job->next_slot >= job->slots) jobs_.pop_front();
      ++job->running;
      lock.unlock();
      run_slot(*job, slot);
      lock.lock();
      if (--job->running == 0) done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job*> jobs_;  // jobs with unclaimed slots, oldest first
  std::vector<std::thread> threads_;
};

}  // namespace

bool run_threads(int threads, const std::function<void(int)>& body) {
  // Never destroyed: workers wait on it until the process ends, and no static destructor
  // can run while a call from another static's destructor still needs it.
  static Pool* const pool = new Pool;
  return pool->run(threads, body);
}

}  // namespace strideattn::detail::cpu
