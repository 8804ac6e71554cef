// The dialling side of a session (session.hpp has both roles): this plane opened it to reach a
// peer url, for a transfer or an ask. Its life: create() -> dial() sends our descriptor (hello)
// over a control link -> pump_link() until the peer's welcome -> connect() -> post_waiting() ->
// transfers and asks -> reset by the plane (a broken link, a missed deadline, cancel, stop). The
// link stays open all along: when it ends, the peer drops its acceptor session.
//
// session_initiator.cpp: set-up, the link, posting transfers, their completions.
// session_initiator_replies.cpp: what the acceptor sends back (pulled bytes, verdicts on runs,
// answers to asks), the asks themselves, and the notices this side sends after RMA.
#pragma once

#include <map>
#include <memory>

#include "control_link.hpp"
#include "same_host.hpp"
#include "session.hpp"

namespace kvnode::transfer {

class InitiatorSession final : public Session {
 public:
  static Result<std::unique_ptr<InitiatorSession>> create(const SessionSetup& setup,
                                                          const PeerDescriptor& pool_descriptor);

  // (Re)dials the peer's listener with our hello; a new link replaces the old one.
  Status dial();
  int dials() const { return dials_; }
  bool has_link() const { return link_.has_value(); }
  int link_fd() const { return link_ ? link_->fd() : -1; }
  std::uint32_t link_events() const { return link_ ? link_->events() : 0; }
  // Sends and reads what the link allows now: the peer's welcome once whole. A link that fails
  // first marks the session broken.
  std::optional<LinkBytes> pump_link();
  // Ends the link: the peer sees it close and drops its side of the session.
  void close_link() { link_.reset(); }

  // Queues a transfer or an ask: posted at once when ready, else by post_waiting().
  void submit(std::unique_ptr<Xfer> xfer);
  void ask(PendingAsk a);
  void post_waiting();

  // Same-host: from now on this session copies its transfers' runs straight to or from the
  // peer's pool mapped here (transfers already posted finish the way they started).
  void attach(std::shared_ptr<const PeerMapping> mapping) { mapping_ = std::move(mapping); }
  bool mapped() const { return mapping_ != nullptr; }

  unsigned progress() override;
  // Transfers that ended since the last call.
  std::vector<std::unique_ptr<Xfer>> take_finished() { return std::exchange(finished_, {}); }
  // Asks answered, failed or expired since the last call, with their results.
  std::vector<std::pair<PendingAsk, Result<std::vector<std::byte>>>> take_answered(
      Clock::time_point now);
  // Fails every transfer and ask on this session; the caller then destroys it.
  std::vector<std::unique_ptr<Xfer>> fail_all(Failure first, TransferId culprit,
                                              const std::string& why);

  std::optional<Clock::time_point> earliest_deadline() const;
  std::optional<TransferId> expired(Clock::time_point now) const;
  bool has(TransferId id) const { return xfers_.count(id) != 0; }

 private:
  InitiatorSession(const SessionSetup& setup, ucx::Worker worker)
      : Session(setup, std::move(worker)) {}

  void completed(Op& op, ucs_status_t status) override;
  void serve(Deferred& d) override;
  void landed(Copy& copy, const Status& status) override;

  void post(Xfer& x);
  bool use_rma(Xfer& x) const;
  static constexpr std::uint64_t kCmaPushViaAmBytes = 8 << 20;  // per run, on average
  void post_rma(Xfer& x);
  void post_am(Xfer& x);
  void post_mapped(Xfer& x);
  // Staged pools move one page per message; mapped and one-sided copies take whole runs.
  std::uint32_t max_run() const { return !mapping_ && (staging_ || !remote_.rma) ? 1 : UINT32_MAX; }
  Xfer* find(TransferId id);
  // After RMA: tells the peer which of its pages x wrote (kWritten) or read (kRead).
  void notify(unsigned am_id, Xfer& x);
  void post_ask(PendingAsk a);
  void asked(std::uint64_t id, Result<std::vector<std::byte>> result);

  static ucs_status_t on_pull_data(void* arg, const void* header, std::size_t header_length,
                                   void* data, std::size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t on_run_answer(void* arg, const void* header, std::size_t header_length,
                                    void* data, std::size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t on_answer(void* arg, const void* header, std::size_t header_length,
                                void* data, std::size_t length, const ucp_am_recv_param_t* p);

  // The control link it dialled (hello, welcome, then liveness) and the hello, kept for redials.
  std::optional<ControlLink> link_;
  LinkBytes hello_;
  int dials_ = 0;

  std::shared_ptr<const PeerMapping> mapping_;  // the peer's pool, once mapped
  std::deque<std::unique_ptr<Xfer>> waiting_;   // until connected
  std::map<TransferId, std::unique_ptr<Xfer>> xfers_;
  std::vector<std::unique_ptr<Xfer>> finished_;
  std::deque<PendingAsk> asks_waiting_;  // until connected
  std::map<std::uint64_t, PendingAsk> asks_;
  std::vector<std::pair<PendingAsk, Result<std::vector<std::byte>>>> answered_;
};

}  // namespace kvnode::transfer
