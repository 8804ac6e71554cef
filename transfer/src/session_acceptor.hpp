// The serving side of a session (session.hpp has both roles): a peer dialled our listener and its
// hello opened this session, on the listener's link. It serves that peer's requests against our
// pool: pulls (send runs back), pushes (receive runs into pages), and the notices its RMA leaves
// (pages written or read), every page range checked before a byte is touched. It ends when the
// link does (lost), or when the plane stops.
#pragma once

#include <memory>

#include "listener.hpp"
#include "session.hpp"

namespace kvnode::transfer {

class AcceptorSession final : public Session {
 public:
  // A session for the peer whose hello came on `link`, connected to the worker it named.
  static Result<std::unique_ptr<AcceptorSession>> create(const SessionSetup& setup, LinkId link);

  LinkId link() const { return link_; }
  // Pages the peer wrote into our pool since the last call (push, or RMA and a notice).
  std::vector<std::vector<gpu::PageId>> take_written() { return std::exchange(written_, {}); }
  // Answers or served runs of ours still in flight.
  bool busy() const { return !ops_.empty(); }

 private:
  AcceptorSession(const SessionSetup& setup, ucx::Worker worker, LinkId link)
      : Session(setup, std::move(worker)), link_(link) {}

  void completed(Op& op, ucs_status_t status) override;
  void serve(Deferred& d) override;
  void landed(Copy& copy, const Status& status) override;
  void send_run_header(unsigned am_id, const am::RunHeader& h, std::string text);
  void wrote(std::uint32_t first, std::uint32_t count);

  static ucs_status_t on_pull_request(void* arg, const void* header, std::size_t header_length,
                                      void* data, std::size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t on_push_data(void* arg, const void* header, std::size_t header_length,
                                   void* data, std::size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t on_written(void* arg, const void* header, std::size_t header_length,
                                 void* data, std::size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t on_read(void* arg, const void* header, std::size_t header_length, void* data,
                              std::size_t length, const ucp_am_recv_param_t* p);
  ucs_status_t noticed(bool written, const void* header, std::size_t header_length,
                       const void* data, std::size_t length, const ucp_am_recv_param_t* p);

  LinkId link_;
  std::vector<std::vector<gpu::PageId>> written_;
};

}  // namespace kvnode::transfer
