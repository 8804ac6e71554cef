// The multi-threaded host copy engine. Copies are cut into pieces so that several threads share
// the work of one large copy (one thread's memcpy does not reach the memory bandwidth), and so
// that a cancel returns quickly: it drops the pieces not yet started and waits only for the few
// pieces that threads are copying at that moment. A copy stays one queue entry whose pieces are
// handed out in order, so a huge copy with small pieces costs no memory per piece.
#include "kvnode/gpu/parallel_copy.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvnode::gpu {
namespace {

constexpr std::size_t kMaxThreads = 64;
constexpr std::size_t kMaxDefaultThreads = 8;

class ParallelCopyEngine final : public CopyEngine {
 public:
  ParallelCopyEngine(std::size_t piece_bytes, std::size_t threads, std::function<void()> on_landed)
      : piece_bytes_(piece_bytes),
        on_landed_(std::move(on_landed)),
        name_("memcpy x" + std::to_string(threads)) {}

  ~ParallelCopyEngine() override {
    {
      const std::lock_guard lock(mu_);
      stop_ = true;
      queue_.clear();  // pieces not started never run; running ones finish
    }
    work_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // Called by the factory only: a thread that cannot start is an error; the destructor joins
  // the ones already started.
  Status start(std::size_t threads) {
    threads_.reserve(threads);
    for (std::size_t i = 0; i < threads; ++i) {
      try {
        threads_.emplace_back([this] { run(); });
      } catch (const std::system_error& e) {
        return make_error(ErrorCode::kInternal, "parallel copy: cannot start thread " +
                                                    std::to_string(i + 1) + " of " +
                                                    std::to_string(threads) + ": " + e.what());
      }
    }
    return {};
  }

  Result<Ticket> copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0 && (dst == nullptr || src == nullptr))
      return make_error(ErrorCode::kInvalid, "parallel copy: null address");
    std::unique_lock lock(mu_);
    const Ticket ticket = next_++;
    if (bytes == 0) return ticket;  // done at once: an unknown ticket is done
    queue_.push_back(Job{ticket, static_cast<char*>(dst), static_cast<const char*>(src), bytes});
    tickets_.emplace(ticket, Pending{});
    const bool several = bytes > piece_bytes_;
    lock.unlock();
    if (several)
      work_.notify_all();
    else
      work_.notify_one();
    return ticket;
  }

  Result<bool> done(Ticket ticket) override {
    const std::lock_guard lock(mu_);
    const auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return true;
    if (!it->second.finished()) return false;
    tickets_.erase(it);
    return true;
  }

  void cancel(Ticket ticket) override { cancel(std::span<const Ticket>(&ticket, 1)); }

  void cancel(std::span<const Ticket> tickets) override {
    std::unique_lock lock(mu_);
    // Every one is marked and unqueued before any wait, so no thread starts another of them.
    for (Ticket ticket : tickets) {
      const auto it = tickets_.find(ticket);
      if (it == tickets_.end()) continue;
      it->second.cancelled = true;
      if (it->second.queued) {
        std::erase_if(queue_, [&](const Job& job) { return job.ticket == ticket; });
        it->second.queued = false;
      }
    }
    // Looked up again each time: a done() from another thread may forget a ticket meanwhile.
    idle_.wait(lock, [&] {
      return std::all_of(tickets.begin(), tickets.end(), [&](Ticket ticket) {
        const auto found = tickets_.find(ticket);
        return found == tickets_.end() || found->second.running == 0;
      });
    });
    for (Ticket ticket : tickets) tickets_.erase(ticket);
  }

  const char* name() const override { return name_.c_str(); }

 private:
  // One copy in the queue; `next` is the offset of its first piece not handed out yet.
  struct Job {
    Ticket ticket;
    char* dst;
    const char* src;
    std::size_t bytes;
    std::size_t next = 0;
  };
  struct Pending {
    std::size_t running = 0;  // pieces being copied by threads now
    bool queued = true;       // pieces remain in the queue
    bool cancelled = false;   // a cancel() waits for the running pieces
    bool finished() const { return !queued && running == 0; }
  };

  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      Job& job = queue_.front();
      const Ticket ticket = job.ticket;
      const std::size_t offset = job.next;
      const std::size_t bytes = std::min(piece_bytes_, job.bytes - offset);
      char* const dst = job.dst + offset;
      const char* const src = job.src + offset;
      job.next += bytes;
      Pending& pending = tickets_.at(ticket);  // stays: erased only when nothing runs
      ++pending.running;
      if (job.next == job.bytes) {
        queue_.pop_front();
        pending.queued = false;
      }
      lock.unlock();
      std::memcpy(dst, src, bytes);
      lock.lock();
      --pending.running;
      if (!pending.finished()) continue;
      if (pending.cancelled) {
        idle_.notify_all();
      } else if (on_landed_ && !stop_) {
        lock.unlock();
        on_landed_();
        lock.lock();
      }
    }
  }

  const std::size_t piece_bytes_;
  const std::function<void()> on_landed_;
  const std::string name_;
  std::mutex mu_;
  std::condition_variable work_;  // copy threads: a piece is queued, or stop
  std::condition_variable idle_;  // cancel(): a cancelled ticket's last running piece ended
  std::deque<Job> queue_;
  std::unordered_map<Ticket, Pending> tickets_;
  Ticket next_ = 1;
  bool stop_ = false;
  std::vector<std::thread> threads_;  // last: started after every other member exists
};

}  // namespace

std::size_t default_copy_threads() {
  const std::size_t half = std::thread::hardware_concurrency() / 2;
  return std::clamp<std::size_t>(half, 1, kMaxDefaultThreads);
}

Result<std::unique_ptr<CopyEngine>> make_parallel_copy_engine(const ParallelCopyOptions& options) {
  if (options.piece_bytes == 0)
    return make_error(ErrorCode::kInvalid, "parallel copy: piece_bytes must be above 0");
  if (options.threads > kMaxThreads)
    return make_error(ErrorCode::kInvalid, "parallel copy: " + std::to_string(options.threads) +
                                               " threads (at most " + std::to_string(kMaxThreads) +
                                               ")");
  const std::size_t threads = options.threads != 0 ? options.threads : default_copy_threads();
  auto engine =
      std::make_unique<ParallelCopyEngine>(options.piece_bytes, threads, options.on_landed);
  if (Status started = engine->start(threads); !started) return started.error();
  return std::unique_ptr<CopyEngine>(std::move(engine));
}

}  // namespace kvnode::gpu
