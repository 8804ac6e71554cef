#include "peer_protocol.hpp"

#include <cstring>
#include <type_traits>

namespace kvnode::node::peer {
namespace {

constexpr std::size_t kHeader = 4;  // version, op, count u16

class Writer {
 public:
  Writer(Op op, std::size_t count, std::size_t item_bytes) {
    out_.reserve(kHeader + count * item_bytes);
    u8(static_cast<std::uint8_t>(Version::kV2));
    u8(static_cast<std::uint8_t>(op));
    uint(static_cast<std::uint16_t>(count), 2);
  }
  void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void uint(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
  }
  void i64(std::int64_t v) { uint(static_cast<std::uint64_t>(v), 8); }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

// Reads items after a header whose count and length were checked against the item size.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> b) : b_(b), at_(kHeader) {}
  std::uint64_t uint(int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(b_[at_ + i]) << (8 * i);
    at_ += static_cast<std::size_t>(bytes);
    return v;
  }
  std::uint8_t u8() { return static_cast<std::uint8_t>(uint(1)); }
  std::int64_t i64() { return static_cast<std::int64_t>(uint(8)); }

 private:
  std::span<const std::byte> b_;
  std::size_t at_;
};

struct Header {
  Op op = Op::kReserve;
  std::size_t count = 0;
};

Result<Header> header(std::span<const std::byte> b, const char* what) {
  if (b.size() < kHeader)
    return make_error(ErrorCode::kInvalid, std::string(what) + " shorter than its header");
  if (static_cast<std::uint8_t>(b[0]) != static_cast<std::uint8_t>(Version::kV2))
    return make_error(ErrorCode::kInvalid, std::string(what) + " of another protocol version (" +
                                               std::to_string(static_cast<unsigned>(b[0])) + ")");
  const auto op = static_cast<std::uint8_t>(b[1]);
  if (op < static_cast<std::uint8_t>(Op::kReserve) || op > static_cast<std::uint8_t>(Op::kHolds))
    return make_error(ErrorCode::kInvalid,
                      std::string(what) + " with an unknown op " + std::to_string(op));
  const std::size_t count = static_cast<std::size_t>(b[2]) | static_cast<std::size_t>(b[3]) << 8;
  if (count > kMaxChunks)
    return make_error(ErrorCode::kInvalid, std::string(what) + " of " + std::to_string(count) +
                                               " chunks, more than " + std::to_string(kMaxChunks));
  return Header{static_cast<Op>(op), count};
}

Status sized(std::span<const std::byte> b, const Header& h, std::size_t item_bytes,
             const char* what, std::size_t extra = 0) {
  if (b.size() != kHeader + extra + h.count * item_bytes)
    return make_error(ErrorCode::kInvalid, std::string(what) + " " + to_string(h.op) + " of " +
                                               std::to_string(b.size()) +
                                               " bytes does not match its count " +
                                               std::to_string(h.count));
  return {};
}

std::vector<std::byte> hashes_message(Op op, const std::vector<ChunkHash>& hashes) {
  Writer w(op, hashes.size(), 8);
  for (ChunkHash h : hashes) w.i64(h);
  return w.take();
}

std::vector<ChunkHash> read_hashes(Reader& r, std::size_t n) {
  std::vector<ChunkHash> out(n);
  for (ChunkHash& h : out) h = r.i64();
  return out;
}

}  // namespace

const char* to_string(Op op) {
  switch (op) {
    case Op::kReserve:
      return "reserve";
    case Op::kFinish:
      return "finish";
    case Op::kLease:
      return "lease";
    case Op::kUnlease:
      return "unlease";
    case Op::kHolds:
      return "holds";
  }
  return "unknown";
}

const char* to_string(ReserveOutcome o) {
  switch (o) {
    case ReserveOutcome::kPage:
      return "page";
    case ReserveOutcome::kHave:
      return "have";
    case ReserveOutcome::kNoRoom:
      return "no_room";
    case ReserveOutcome::kFrozen:
      return "frozen";
    case ReserveOutcome::kBusy:
      return "busy";
  }
  return "unknown";
}

const char* to_string(FinishOutcome o) {
  switch (o) {
    case FinishOutcome::kStored:
      return "stored";
    case FinishOutcome::kFrozen:
      return "frozen";
    case FinishOutcome::kLost:
      return "lost";
    case FinishOutcome::kReleased:
      return "released";
  }
  return "unknown";
}

Op op_of(const Request& r) {
  return static_cast<Op>(r.index() + 1);
}
Op op_of(const Answer& a) {
  return static_cast<Op>(a.index() + 1);
}

std::vector<std::byte> encode(const Request& request) {
  return std::visit(
      [&](const auto& r) -> std::vector<std::byte> {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, FinishRequest>) {
          Writer w(Op::kFinish, r.chunks.size(), 9);
          w.uint(r.move, 8);
          for (const FinishItem& c : r.chunks) {
            w.i64(c.hash);
            w.u8(c.whole ? 1 : 0);
          }
          return w.take();
        } else if constexpr (std::is_same_v<T, ReserveRequest>) {
          Writer w(Op::kReserve, r.hashes.size(), 8);
          w.uint(r.move, 8);
          for (ChunkHash h : r.hashes) w.i64(h);
          return w.take();
        } else {
          return hashes_message(op_of(request), r.hashes);
        }
      },
      request);
}

std::vector<std::byte> encode(const Answer& answer) {
  return std::visit(
      [&](const auto& a) -> std::vector<std::byte> {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, ReserveAnswer>) {
          Writer w(Op::kReserve, a.chunks.size(), 5);
          for (const Reserved& c : a.chunks) {
            w.u8(static_cast<std::uint8_t>(c.outcome));
            w.uint(c.outcome == ReserveOutcome::kPage ? c.page : 0, 4);
          }
          return w.take();
        } else if constexpr (std::is_same_v<T, FinishAnswer>) {
          Writer w(Op::kFinish, a.chunks.size(), 1);
          for (FinishOutcome o : a.chunks) w.u8(static_cast<std::uint8_t>(o));
          return w.take();
        } else if constexpr (std::is_same_v<T, LeaseAnswer>) {
          Writer w(Op::kLease, a.pages.size(), 4);
          for (gpu::PageId p : a.pages) w.uint(p, 4);
          return w.take();
        } else if constexpr (std::is_same_v<T, UnleaseAnswer>) {
          return Writer(Op::kUnlease, 0, 0).take();
        } else {
          Writer w(Op::kHolds, a.held.size(), 1);
          for (std::uint8_t h : a.held) w.u8(h ? 1 : 0);
          return w.take();
        }
      },
      answer);
}

Result<Request> decode_request(std::span<const std::byte> b) {
  Result<Header> h = header(b, "a request");
  if (!h) return std::move(h).error();
  const std::size_t item = h->op == Op::kFinish ? 9 : 8;
  const bool owned = h->op == Op::kReserve || h->op == Op::kFinish;
  if (Status s = sized(b, *h, item, "a request", owned ? 8 : 0); !s) return s.error();
  Reader r(b);
  switch (h->op) {
    case Op::kReserve: {
      ReserveRequest q;
      q.move = r.uint(8);
      q.hashes = read_hashes(r, h->count);
      return Request{std::move(q)};
    }
    case Op::kFinish: {
      FinishRequest f;
      f.move = r.uint(8);
      f.chunks.resize(h->count);
      for (FinishItem& c : f.chunks) {
        c.hash = r.i64();
        const std::uint8_t whole = r.u8();
        if (whole > 1)
          return make_error(ErrorCode::kInvalid, "a finish item's whole flag is not 0 or 1");
        c.whole = whole == 1;
      }
      return Request{std::move(f)};
    }
    case Op::kLease:
      return Request{LeaseRequest{read_hashes(r, h->count)}};
    case Op::kUnlease:
      return Request{UnleaseRequest{read_hashes(r, h->count)}};
    case Op::kHolds:
      return Request{HoldsRequest{read_hashes(r, h->count)}};
  }
  return make_error(ErrorCode::kInvalid, "a request with an unknown op");
}

Result<Answer> decode_answer(std::span<const std::byte> b) {
  Result<Header> h = header(b, "an answer");
  if (!h) return std::move(h).error();
  std::size_t item = 0;
  switch (h->op) {
    case Op::kReserve:
      item = 5;
      break;
    case Op::kFinish:
      item = 1;
      break;
    case Op::kLease:
      item = 4;
      break;
    case Op::kUnlease:
      item = 0;
      break;
    case Op::kHolds:
      item = 1;
      break;
  }
  if (h->op == Op::kUnlease && h->count != 0)
    return make_error(ErrorCode::kInvalid, "an unlease answer carries no items");
  if (Status s = sized(b, *h, item, "an answer"); !s) return s.error();
  Reader r(b);
  switch (h->op) {
    case Op::kReserve: {
      ReserveAnswer a;
      a.chunks.resize(h->count);
      for (Reserved& c : a.chunks) {
        const std::uint8_t o = r.u8();
        if (o > static_cast<std::uint8_t>(ReserveOutcome::kBusy))
          return make_error(ErrorCode::kInvalid, "a reserve outcome " + std::to_string(o));
        c.outcome = static_cast<ReserveOutcome>(o);
        c.page = static_cast<gpu::PageId>(r.uint(4));
      }
      return Answer{std::move(a)};
    }
    case Op::kFinish: {
      FinishAnswer a;
      a.chunks.resize(h->count);
      for (FinishOutcome& c : a.chunks) {
        const std::uint8_t o = r.u8();
        if (o > static_cast<std::uint8_t>(FinishOutcome::kReleased))
          return make_error(ErrorCode::kInvalid, "a finish outcome " + std::to_string(o));
        c = static_cast<FinishOutcome>(o);
      }
      return Answer{std::move(a)};
    }
    case Op::kLease: {
      LeaseAnswer a;
      a.pages.resize(h->count);
      for (gpu::PageId& p : a.pages) p = static_cast<gpu::PageId>(r.uint(4));
      return Answer{std::move(a)};
    }
    case Op::kUnlease:
      return Answer{UnleaseAnswer{}};
    case Op::kHolds: {
      HoldsAnswer a;
      a.held.resize(h->count);
      for (std::uint8_t& held : a.held) {
        held = r.u8();
        if (held > 1) return make_error(ErrorCode::kInvalid, "a holds flag is not 0 or 1");
      }
      return Answer{std::move(a)};
    }
  }
  return make_error(ErrorCode::kInvalid, "an answer with an unknown op");
}

Status answers(const Request& request, const Answer& answer) {
  if (op_of(request) != op_of(answer))
    return make_error(ErrorCode::kInvalid, std::string("a ") + to_string(op_of(answer)) +
                                               " answer to a " + to_string(op_of(request)));
  const std::size_t asked = std::visit(
      [](const auto& r) -> std::size_t {
        if constexpr (requires { r.hashes; })
          return r.hashes.size();
        else
          return r.chunks.size();
      },
      request);
  const std::size_t got = std::visit(
      [](const auto& a) -> std::size_t {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, LeaseAnswer>)
          return a.pages.size();
        else if constexpr (std::is_same_v<T, HoldsAnswer>)
          return a.held.size();
        else if constexpr (std::is_same_v<T, UnleaseAnswer>)
          return 0;
        else
          return a.chunks.size();
      },
      answer);
  const Op op = op_of(request);
  const bool fits = op == Op::kUnlease ? got == 0 : op == Op::kLease ? got <= asked : got == asked;
  if (!fits)
    return make_error(ErrorCode::kInvalid, std::string("a ") + to_string(op) + " answer of " +
                                               std::to_string(got) + " chunks to a request of " +
                                               std::to_string(asked));
  return {};
}

}  // namespace kvnode::node::peer
