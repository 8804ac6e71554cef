// A node asked, by any controller, to move chunks to its own peer_init_url (issue 19 item 1): it
// answers an ErrorMsg and keeps every chunk, however the url spells its address. Before, every
// chunk counted as "already there" and a move with copy off evicted the only copy. Real kvnode
// processes bound to the wildcard address and to loopback (issue 34 item 3: a loopback-bound node
// took 0.0.0.0:<its port> for another node and lost all its chunks), the MoveWorkerMsg sent
// straight to the worker port.
#include <zmq.hpp>

#include "kvnode/wire/codec.hpp"
#include "node_process.hpp"

namespace kvnode::node {
namespace {

using namespace proc;

// One request to a node's worker port (REQ), its decoded reply; an ErrorMsg when none came.
wire::Msg ask(int port, const wire::Msg& request) {
  zmq::context_t context;
  zmq::socket_t socket(context, zmq::socket_type::req);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvtimeo, 30'000);
  socket.connect("tcp://127.0.0.1:" + std::to_string(port));
  socket.send(zmq::buffer(wire::encode(request)), zmq::send_flags::none);
  zmq::message_t reply;
  if (!socket.recv(reply)) return wire::ErrorMsg{"test: no reply within 30 s"};
  Result<wire::Msg> m = wire::decode(reply.to_string());
  return m ? std::move(m).value() : wire::ErrorMsg{"test: undecodable reply"};
}

void expect_every_self_move_refused(const std::string& bind) {
  auto ctl = start_controller();
  NodeProcessOptions o;
  o.p2p_host = bind;
  NodeProcess node("self", ctl->ports().pull, ctl->ports().reply, o);
  ASSERT_TRUE(node.up()) << node.log();
  const std::string tokens = "0:320";  // 20 chunks of 16 tokens
  auto put = kvctl({"put", "--node", node.socket(), "--token-range", tokens, "--seed", "1"});
  ASSERT_EQ(put.exit_code, 0) << put.out << put.err << node.log();

  std::vector<std::int64_t> token_ids(320);
  for (std::size_t i = 0; i < token_ids.size(); ++i) token_ids[i] = static_cast<std::int64_t>(i);
  const std::string port = std::to_string(node.p2p_port());
  for (const std::string& self : {"127.0.0.1:" + port, "localhost:" + port, "0.0.0.0:" + port,
                                  "[::]:" + port, "[::ffff:127.0.0.1]:" + port}) {
    for (const bool copy : {false, true}) {
      const wire::Msg reply =
          ask(node.worker_port(),
              wire::MoveWorkerMsg{"MoveWorker0-self", "LocalCPUBackend",
                                  wire::Position{self, "LocalCPUBackend"}, token_ids, copy});
      const auto* error = std::get_if<wire::ErrorMsg>(&reply);
      ASSERT_NE(error, nullptr) << bind << " bind, " << self << " copy=" << copy << ": a "
                                << wire::tag_of(reply) << ", not an ErrorMsg\n"
                                << node.log();
      EXPECT_NE(error->error.find("is this node itself"), std::string::npos) << error->error;
    }
  }
  auto verify = kvctl({"verify", "--node", node.socket(), "--token-range", tokens, "--seed", "1"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  EXPECT_NE(verify.out.find("verified 20 of 20 chunks"), std::string::npos) << verify.out;
}

TEST(SelfMove, AWildcardBoundNodeAskedToMoveToItselfAnswersAnErrorAndKeepsEveryChunk) {
  expect_every_self_move_refused("0.0.0.0");  // reached at every address of the host
}

TEST(SelfMove, ALoopbackBoundNodeAskedToMoveToItselfAnswersAnErrorAndKeepsEveryChunk) {
  expect_every_self_move_refused("127.0.0.1");  // 0.0.0.0 and :: as a destination reach it too
}

}  // namespace
}  // namespace kvnode::node
