// Receipts: the text a receive hands out (queue, id, delivery), its parsing, and the
// fence that refuses a receipt of an earlier delivery.
#include "queue/queue_impl.h"

namespace spool {

auto Queue::Impl::receipt(uint64_t id, uint32_t gen) const -> std::string {
  char buf[48];
  char* p = std::to_chars(buf, buf + 20, id).ptr;
  *p++ = '.';
  p = std::to_chars(p, p + 10, gen).ptr;
  *p++ = '.';
  static constexpr char kHex[] = "0123456789abcdef";
  // A subscription's receipts carry its view in the tag: one of another view is refused.
  uint32_t tag = static_cast<uint32_t>(cfg.uid) ^ view_k;
  for (int shift = 28; shift >= 0; shift -= 4) *p++ = kHex[(tag >> shift) & 0xf];
  return std::string(buf, p);
}

auto Queue::Impl::parse_receipt(std::string_view r) const -> Result<ReceiptRef> {
  auto malformed = [&] {
    return Status(Code::kInvalidArgument,
                  "malformed receipt '" + std::string(r) + "' (expected ID.GEN.TAG as printed by receive)");
  };
  uint64_t id = 0;
  uint32_t gen = 0, tag = 0;
  const char* p = r.data();
  const char* end = r.data() + r.size();
  auto num = [&](auto& out, int base) {
    if (p == end || *p == '+' || *p == '-') return false;
    auto res = std::from_chars(p, end, out, base);
    if (res.ec != std::errc()) return false;
    p = res.ptr;
    return true;
  };
  auto dot = [&] { return p != end && *p++ == '.'; };
  const char* tag_start = nullptr;
  if (!num(id, 10) || !dot() || !num(gen, 10) || !dot() || (tag_start = p, !num(tag, 16)) || p != end ||
      p - tag_start > 8 || id == 0 || gen == 0) {
    return malformed();
  }
  if (tag != (static_cast<uint32_t>(cfg.uid) ^ view_k)) {
    return Status(Code::kInvalidArgument, "receipt '" + std::string(r) + "' belongs to another queue than " + dir +
                                              (view_k != 0 ? " (subscription " + view_name + ")" : std::string()));
  }
  return ReceiptRef{id, gen};
}

auto Queue::Impl::fence(index::SharedIndex& v, ReceiptRef ref) -> Result<uint32_t> {
  v.assert_held();
  int64_t slot = v.find(ref.id);
  if (slot < 0) {
    return Status(Code::kNotFound, "message " + std::to_string(ref.id) +
                                       " is not in the queue (already acked, dead-lettered or purged)");
  }
  const Entry& e = v.entry(static_cast<uint32_t>(slot));
  if (e.count != ref.gen) {
    return Status(Code::kLeaseLost,
                  "lease lost: message " + std::to_string(ref.id) + " was received again (delivery " +
                      std::to_string(e.count) + "; this receipt is for delivery " + std::to_string(ref.gen) + ")");
  }
  return static_cast<uint32_t>(slot);
}

auto Queue::Impl::lock_fenced(std::string_view r) -> Result<Fenced> {
  auto ref = parse_receipt(r);
  if (!ref.ok()) return ref.status();
  SPOOL_LOCK_OR_RETURN(held, *this, lock_to_change());
  auto viewed = here();
  if (!viewed.ok()) return viewed.status();
  auto slot = fence(**viewed, *ref);
  if (!slot.ok()) return slot.status();
  return Fenced{std::move(held).value(), ref->id, ref->gen, *slot};
}

}  // namespace spool
