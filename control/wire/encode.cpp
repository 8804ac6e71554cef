// Encoding half of the codec (kept apart from decoding so the two compile in parallel).
#include "encoder.hpp"
#include "kvnode/wire/codec.hpp"

namespace kvnode::wire {
namespace detail {

void encode_scalar(Writer& w, std::int64_t v) {
  w.pk.pack_int64(v);
}
void encode_scalar(Writer& w, const WideInt& v) {
  if (v.negative())
    w.pk.pack_int64(static_cast<std::int64_t>(v.bits()));
  else
    w.pk.pack_uint64(v.bits());
}
void encode_scalar(Writer& w, double v) {
  w.float64(v);
}
void encode_scalar(Writer& w, bool v) {
  if (v)
    w.pk.pack_true();
  else
    w.pk.pack_false();
}
void encode_scalar(Writer& w, const std::string& v) {
  w.str(v);
}
void encode_scalar(Writer& w, OpType v) {
  w.str(v == OpType::kAdmit ? "admit" : "evict");
}

}  // namespace detail

namespace {

template <class T>
void encode_into(const T& value, std::string& out) {
  detail::Writer w(out);
  detail::encode_value(w, value);
}

}  // namespace

void encode(const Msg& msg, std::string& out) {
  encode_into(msg, out);
}
void encode(const KVOpEvent& event, std::string& out) {
  encode_into(event, out);
}
void encode(const AnyCommand& command, std::string& out) {
  encode_into(command, out);
}

std::string encode(const Msg& msg) {
  std::string out;
  encode(msg, out);
  return out;
}

std::string_view tag_of(const Msg& msg) {
  return std::visit([](const auto& m) { return std::decay_t<decltype(m)>::kTag; }, msg);
}

std::string python_class_text(std::string_view tag) {
  return "<class 'lmcache.v1.cache_controller.message." + std::string(tag) + "'>";
}

}  // namespace kvnode::wire
