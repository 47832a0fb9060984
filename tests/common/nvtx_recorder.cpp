// NvtxRecorder: see nvtx_recorder.hpp. NVTX calls InitializeInjectionNvtx2_fnptr (a weak symbol in
// every file that includes the NVTX headers, defined here for real) at the first NVTX call, and
// this injection points the core table's domain functions at the recorder.
#include "common/nvtx_recorder.hpp"

#include <cstdint>

// This file defines the injection pointer itself, so NVTX's weak definition of it is skipped here
// (NVTX_STATIC_INJECTION_IMPL) and NVTX's initialization code reads this declaration.
#define NVTX_STATIC_INJECTION_IMPL
extern "C" {
extern int (*InitializeInjectionNvtx2_fnptr)(const void* (*)(std::uint32_t));
}
#include <nvtx3/nvToolsExt.h>

#include <deque>
#include <mutex>

namespace spg::test {
namespace {

struct State {
  std::mutex mutex;
  bool attached{false};
  std::deque<std::string> strings;  // registered strings; a handle is the address of one
  std::deque<std::string> domains;  // created domains; a handle is the address of one
  std::vector<NvtxRange> pushed;
  int open{0};
  int pops{0};
  bool underflow{false};
};

State& state() {
  static State s;
  return s;
}

bool ours(nvtxDomainHandle_t domain) {
  return domain != nullptr && *reinterpret_cast<const std::string*>(domain) == "spgraph";
}

nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  s.domains.emplace_back(name != nullptr ? name : "");
  return reinterpret_cast<nvtxDomainHandle_t>(&s.domains.back());
}

nvtxStringHandle_t NVTX_API register_string(nvtxDomainHandle_t, const char* text) {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  s.strings.emplace_back(text != nullptr ? text : "");
  return reinterpret_cast<nvtxStringHandle_t>(&s.strings.back());
}

int NVTX_API range_push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  if (!ours(domain)) return 0;
  State& s = state();
  const std::lock_guard lock(s.mutex);
  NvtxRange r;
  if (a != nullptr && a->messageType == NVTX_MESSAGE_TYPE_REGISTERED && a->message.registered != nullptr) {
    r.name = *reinterpret_cast<const std::string*>(a->message.registered);
  } else if (a != nullptr && a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii != nullptr) {
    r.name = a->message.ascii;
  }
  if (a != nullptr && a->payloadType == NVTX_PAYLOAD_TYPE_INT64) r.payload = a->payload.llValue;
  r.depth = s.open;
  s.pushed.push_back(r);
  return ++s.open;
}

int NVTX_API range_pop(nvtxDomainHandle_t domain) {
  if (!ours(domain)) return 0;
  State& s = state();
  const std::lock_guard lock(s.mutex);
  ++s.pops;
  if (s.open == 0) {
    s.underflow = true;
    return -1;
  }
  return --s.open;
}

template <class F>
void set_slot(NvtxFunctionTable table, unsigned size, NvtxCallbackIdCore2 id, F f) {
  if (static_cast<unsigned>(id) < size && table[id] != nullptr) *table[id] = reinterpret_cast<NvtxFunctionPointer>(f);
}

int NVTX_API initialize(NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned size = 0;
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) == 0 || table == nullptr) return 0;
  set_slot(table, size, NVTX_CBID_CORE2_DomainCreateA, &domain_create);
  set_slot(table, size, NVTX_CBID_CORE2_DomainRegisterStringA, &register_string);
  set_slot(table, size, NVTX_CBID_CORE2_DomainRangePushEx, &range_push);
  set_slot(table, size, NVTX_CBID_CORE2_DomainRangePop, &range_pop);
  const std::lock_guard lock(state().mutex);
  state().attached = true;
  return 1;
}

}  // namespace

bool NvtxRecorder::attached() {
  const std::lock_guard lock(state().mutex);
  return state().attached;
}

void NvtxRecorder::clear() {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  s.pushed.clear();
  s.open = 0;
  s.pops = 0;
  s.underflow = false;
}

std::vector<NvtxRange> NvtxRecorder::pushed() {
  const std::lock_guard lock(state().mutex);
  return state().pushed;
}

int NvtxRecorder::open() {
  const std::lock_guard lock(state().mutex);
  return state().open;
}

int NvtxRecorder::pops() {
  const std::lock_guard lock(state().mutex);
  return state().pops;
}

bool NvtxRecorder::underflow() {
  const std::lock_guard lock(state().mutex);
  return state().underflow;
}

}  // namespace spg::test

// The static injection NVTX looks for (nvtxDetail/nvtxInit.h): a strong definition overriding the
// weak ones of the library's objects.
extern "C" {
NvtxInitializeInjectionNvtxFunc_t InitializeInjectionNvtx2_fnptr = &spg::test::initialize;
}
