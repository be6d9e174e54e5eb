// libFuzzer: every message decoder of the protocol (transport/protocol.h)
// and the weights manifest decoder (tierkv/weights.h), which the daemon runs
// on kWeightsSeal payloads. The first byte picks the message type, the rest
// is its payload; a payload that decodes is encoded again and must decode
// to the same bytes' worth.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "tierkv/weights.h"
#include "transport/protocol.h"

namespace {

template <typename M>
void Try(std::span<const std::byte> in) {
  M m;
  if (!tierkv::transport::Decode(in, m).ok()) return;
  // What decodes must survive a round trip (no UB in the encoder either).
  const auto again = tierkv::transport::Encode(m);
  M m2;
  if (!tierkv::transport::Decode(again, m2).ok()) __builtin_trap();
}

// A manifest that decodes is valid, and encodes to the bytes it came from
// (the encoding is canonical: the version hashes it).
void TryManifest(std::span<const std::byte> in) {
  auto m = tierkv::DecodeWeightsManifest(in);
  if (!m.ok()) return;
  if (!m->Validate().ok()) __builtin_trap();
  const auto again = tierkv::EncodeWeightsManifest(*m);
  if (again.size() != in.size() ||
      !std::equal(again.begin(), again.end(), in.begin())) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierkv::transport;
  if (size == 0) return 0;
  const std::span<const std::byte> in(
      reinterpret_cast<const std::byte*>(data) + 1, size - 1);
  switch (data[0] % 29) {
    case 0:
      Try<JsonResponse>(in);
      break;
    case 1:
      Try<OpenNamespaceRequest>(in);
      break;
    case 2:
      Try<OpenNamespaceResponse>(in);
      break;
    case 3:
      Try<RegisterLayoutRequest>(in);
      break;
    case 4:
      Try<MatchRequest>(in);
      Try<PrefetchRequest>(in);
      break;
    case 5:
      Try<MatchResponse>(in);
      break;
    case 6:
      Try<PutReserveRequest>(in);
      break;
    case 7:
      Try<PutReserveResponse>(in);
      break;
    case 8:
      Try<KeysRequest>(in);
      break;
    case 9:
      Try<ItemStatusResponse>(in);
      break;
    case 10:
      Try<GetResponse>(in);
      break;
    case 11:
      Try<ReleaseRequest>(in);
      break;
    case 12:
      Try<StatusResponse>(in);
      break;
    case 13:
      Try<ListRequest>(in);
      break;
    case 14:
      Try<ListResponse>(in);
      break;
    case 15:
      Try<RegisterPoolRequest>(in);
      break;
    case 16:
      Try<RegisterTicketsRequest>(in);
      break;
    case 17:
      Try<TransferRequest>(in);
      break;
    case 18:
      Try<TopkReportRequest>(in);
      break;
    case 19:
      Try<WeightsSealRequest>(in);
      break;
    case 20:
      Try<WeightsSealResponse>(in);
      break;
    case 21:
      Try<WeightsSelectRequest>(in);
      break;
    case 22:
      Try<WeightsManifestResponse>(in);
      break;
    case 23:
      Try<WeightsListResponse>(in);
      break;
    case 24:
      Try<WeightsDropResponse>(in);
      break;
    case 25:
      TryManifest(in);
      break;
    case 26:
      Try<WeightsHintRequest>(in);
      break;
    case 27:
      Try<WeightsPinRequest>(in);
      break;
    default:
      (void)DecodeError(in);
      break;
  }
  return 0;
}
