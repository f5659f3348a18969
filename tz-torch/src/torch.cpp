// tz-torch: libtorch modules and tensors <-> tensorizer files, over the C ABI.
// One translation unit on purpose: every libtorch header costs seconds.
#include "tensorizer/torch.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

// Stored dtype strings name the byte order; we write host order, as upstream.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "tz-torch writes little-endian dtype strings");

// Dtypes newer than the oldest supported libtorch (1.13, Debian bookworm's
// libtorch-dev) are compiled in only where libtorch has them.
#define TZ_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace tensorizer {
namespace torch {

Error::Error(int code, const std::string& message) : std::runtime_error(message), code_(code) {}

const char* Error::code_name() const noexcept { return tz_status_name(code_); }

namespace {

using ST = c10::ScalarType;

[[noreturn]] void fail(int code, const std::string& message) { throw Error(code, message); }

// The message must be copied before any other libtensorizer call on this thread.
void check(int rc) {
  if (rc != TZ_OK) throw Error(rc, tz_error_last());
}

// ---- dtypes ---------------------------------------------------------------

struct DType {
  ST type;
  const char* name;   // torch's Python name, as stored after "torch."
  const char* numpy;  // numpy typestr, or nullptr: stored opaquely
};

// The Python package's table (_dtypes.py): numpy-convertible types by numpy's
// typestr; bfloat16, complex32, float8/float4, bits and sub-byte ints opaquely.
const DType kDTypes[] = {
    {ST::Half, "float16", "<f2"},
    {ST::Float, "float32", "<f4"},
    {ST::Double, "float64", "<f8"},
    {ST::ComplexFloat, "complex64", "<c8"},
    {ST::ComplexDouble, "complex128", "<c16"},
    {ST::Bool, "bool", "|b1"},
    {ST::Char, "int8", "|i1"},
    {ST::Short, "int16", "<i2"},
    {ST::Int, "int32", "<i4"},
    {ST::Long, "int64", "<i8"},
    {ST::Byte, "uint8", "|u1"},
#if TZ_TORCH_AT_LEAST(2, 3)
    {ST::UInt16, "uint16", "<u2"},
    {ST::UInt32, "uint32", "<u4"},
    {ST::UInt64, "uint64", "<u8"},
#endif
    {ST::BFloat16, "bfloat16", nullptr},
    {ST::ComplexHalf, "complex32", nullptr},
#if TZ_TORCH_AT_LEAST(2, 1)
    {ST::Float8_e5m2, "float8_e5m2", nullptr},
    {ST::Float8_e4m3fn, "float8_e4m3fn", nullptr},
#endif
#if TZ_TORCH_AT_LEAST(2, 2)
    {ST::Float8_e5m2fnuz, "float8_e5m2fnuz", nullptr},
    {ST::Float8_e4m3fnuz, "float8_e4m3fnuz", nullptr},
#endif
#if TZ_TORCH_AT_LEAST(2, 7)
    {ST::Float8_e8m0fnu, "float8_e8m0fnu", nullptr},
#endif
#if TZ_TORCH_AT_LEAST(2, 8)
    {ST::Float4_e2m1fn_x2, "float4_e2m1fn_x2", nullptr},
#endif
#if TZ_TORCH_AT_LEAST(2, 1)
    {ST::Bits1x8, "bits1x8", nullptr},
    {ST::Bits2x4, "bits2x4", nullptr},
    {ST::Bits4x2, "bits4x2", nullptr},
    {ST::Bits8, "bits8", nullptr},
    {ST::Bits16, "bits16", nullptr},
#endif
#if TZ_TORCH_AT_LEAST(2, 3)
    {ST::UInt1, "uint1", nullptr},
    {ST::UInt2, "uint2", nullptr},
    {ST::UInt3, "uint3", nullptr},
    {ST::UInt4, "uint4", nullptr},
    {ST::UInt5, "uint5", nullptr},
    {ST::UInt6, "uint6", nullptr},
    {ST::UInt7, "uint7", nullptr},
#endif
#if TZ_TORCH_AT_LEAST(2, 5)
    {ST::Int1, "int1", nullptr},
    {ST::Int2, "int2", nullptr},
    {ST::Int3, "int3", nullptr},
    {ST::Int4, "int4", nullptr},
    {ST::Int5, "int5", nullptr},
    {ST::Int6, "int6", nullptr},
    {ST::Int7, "int7", nullptr},
#endif
};

// Quantized values mean nothing without their scale and zero point.
const DType kQuantized[] = {
    {ST::QInt8, "qint8", nullptr},       {ST::QUInt8, "quint8", nullptr},
    {ST::QInt32, "qint32", nullptr},     {ST::QUInt4x2, "quint4x2", nullptr},
    {ST::QUInt2x4, "quint2x4", nullptr},
};

// Same-width integers that opaque data is viewed as (FORMAT.md §4.4).
ST stand_in(size_t itemsize) {
  switch (itemsize) {
    case 1: return ST::Char;
    case 2: return ST::Short;
    case 4: return ST::Int;
    case 8: return ST::Long;
    default: fail(TZ_E_UNSUPPORTED, "no integer stand-in for " + std::to_string(itemsize) + "-byte opaque elements");
  }
}

const DType* find_dtype(ST type) {
  for (const DType& d : kDTypes)
    if (d.type == type) return &d;
  return nullptr;
}

ST native_type(std::string_view np) {
  size_t p = (!np.empty() && std::strchr("<>|=", np[0]) != nullptr) ? 1 : 0;
  if (p + 2 > np.size()) fail(TZ_E_FORMAT, "invalid dtype string '" + std::string(np) + "'");
  const char kind = np[p];
  const std::string_view digits = np.substr(p + 1);
  if (digits.size() > 2 || digits.find_first_not_of("0123456789") != std::string_view::npos)
    fail(TZ_E_FORMAT, "invalid dtype string '" + std::string(np) + "'");
  const int size = std::stoi(std::string(digits));
  switch (kind) {
    case 'b': if (size == 1) return ST::Bool; break;
    case 'i':
      if (size == 1) return ST::Char;
      if (size == 2) return ST::Short;
      if (size == 4) return ST::Int;
      if (size == 8) return ST::Long;
      break;
    case 'u':
      if (size == 1) return ST::Byte;
#if TZ_TORCH_AT_LEAST(2, 3)
      if (size == 2) return ST::UInt16;
      if (size == 4) return ST::UInt32;
      if (size == 8) return ST::UInt64;
#endif
      break;
    case 'f':
      if (size == 2) return ST::Half;
      if (size == 4) return ST::Float;
      if (size == 8) return ST::Double;
      break;
    case 'c':
      if (size == 8) return ST::ComplexFloat;
      if (size == 16) return ST::ComplexDouble;
      break;
    default: break;
  }
  fail(TZ_E_UNSUPPORTED, "no torch dtype for numpy type '" + std::string(np) + "'");
}

// ---- handles ----------------------------------------------------------------

using OptionsPtr = std::unique_ptr<tz_options, decltype(&tz_options_free)>;
using ReaderPtr = std::unique_ptr<tz_reader, decltype(&tz_reader_free)>;
using WriterPtr = std::unique_ptr<tz_writer, decltype(&tz_writer_free)>;

OptionsPtr make_options(const std::optional<Key>& key,
                        const std::vector<std::pair<std::string, std::string>>& extra, unsigned threads,
                        bool verify_hash) {
  tz_options* raw = nullptr;
  check(tz_options_new(&raw));
  OptionsPtr opts(raw, tz_options_free);
  if (threads > 0) check(tz_options_set(raw, "num_threads", std::to_string(threads).c_str()));
  if (verify_hash) check(tz_options_set(raw, "verify_hash", "1"));
  for (const auto& [k, v] : extra) check(tz_options_set(raw, k.c_str(), v.c_str()));
  if (key) check(tz_options_set_key(raw, key->get()));
  return opts;
}

std::string join_path(const tz_tensor_info& info) {
  if (info.path_len == 1 && !info.path[0].is_index) return {info.path[0].str, info.path[0].str_len};
  std::string out;
  for (size_t k = 0; k < info.path_len; ++k) {
    if (k) out += '.';
    const tz_path_component& c = info.path[k];
    out += c.is_index ? std::to_string(c.index) : std::string(c.str, c.str_len);
  }
  return out;
}

std::string shape_string(c10::IntArrayRef shape) {
  std::string s = "(";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// What the file says about one tensor, copied out of the reader's borrowed info.
struct Stored {
  uint64_t index;
  std::string name;
  std::vector<PathComponent> path;
  bool plain;
  TensorType type;
  ST dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
};

// Nothing is decoded for a tensor the filter leaves out.
std::optional<Stored> describe(tz_reader* reader, uint64_t index,
                               const std::function<bool(const std::string&)>& filter) {
  tz_tensor_info info{};
  info.version = TZ_TENSOR_INFO_VERSION;
  check(tz_reader_tensor_info(&info, reader, index));
  Stored s;
  s.index = index;
  s.name = join_path(info);
  if (filter && !filter(s.name)) return std::nullopt;
  s.plain = info.path_len == 1 && !info.path[0].is_index;
  for (size_t k = 0; k < info.path_len; ++k) {
    const tz_path_component& c = info.path[k];
    s.path.push_back(c.is_index ? PathComponent(uint64_t(c.index)) : PathComponent(std::string(c.str, c.str_len)));
  }
  s.type = TensorType(info.tensor_type);
  s.dtype = scalar_type_from_dtype({info.dtype, info.dtype_len});
  if (c10::elementSize(s.dtype) != info.itemsize) {
    fail(TZ_E_FORMAT, "tensor '" + s.name + "': " + c10::toString(s.dtype) + " elements are not " +
                          std::to_string(info.itemsize) + " bytes");
  }
  for (uint32_t d = 0; d < info.ndim; ++d) {
    if (info.shape[d] > uint64_t(INT64_MAX)) fail(TZ_E_LIMIT, "tensor '" + s.name + "' is too large");
    s.shape.push_back(int64_t(info.shape[d]));
  }
  s.nbytes = info.nbytes;
  return s;
}

struct ReaderSession {
  ReaderPtr reader{nullptr, tz_reader_free};
  uint64_t count = 0;
};

ReaderSession open_reader(const std::string& uri, const LoadOptions& o) {
  OptionsPtr opts = make_options(o.key, o.options, o.num_readers, false);
  tz_reader* raw = nullptr;
  check(tz_reader_open(&raw, uri.c_str(), opts.get()));
  ReaderSession s;
  s.reader.reset(raw);
  check(tz_reader_tensor_count(&s.count, raw));
  return s;
}

// One tensor to read into `dst`: straight into its memory when `direct`,
// otherwise through a host staging tensor (pinned for CUDA) and copy_.
struct ReadJob {
  uint64_t index;
  at::Tensor dst;
  uint64_t nbytes;
  bool direct;
};

// Opaque types may lack copy kernels (uint1-7, int1-7); their same-width
// integers have them, so copies go through an integer view.
at::Tensor copyable(const at::Tensor& t) {
  const DType* d = find_dtype(t.scalar_type());
  return d != nullptr && d->numpy == nullptr ? t.view(stand_in(t.element_size())) : t;
}

void* dst_pointer(const at::Tensor& t) {
  static uint8_t empty_target;  // a valid address for zero-byte reads
  void* p = t.data_ptr();
  return p ? p : &empty_target;
}

bool cuda_available() { return ::torch::cuda::is_available(); }

void run_jobs(tz_reader* reader, std::vector<ReadJob>& jobs, const LoadOptions& o) {
  const uint32_t flags = o.verify_hash ? TZ_READ_VERIFY_HASH : 0u;
  bool copied_to_cuda = false;
  size_t next = 0;
  while (next < jobs.size()) {
    std::vector<tz_read_request> requests;
    std::vector<std::pair<size_t, at::Tensor>> staged;
    size_t staged_bytes = 0;
    size_t end = next;
    for (; end < jobs.size(); ++end) {
      ReadJob& job = jobs[end];
      if (job.direct) {
        requests.push_back({TZ_READ_REQUEST_VERSION, job.index, dst_pointer(job.dst), job.nbytes});
        continue;
      }
      // Bounded staging: a batch holds at least one tensor, however large.
      if (!staged.empty() && staged_bytes + job.nbytes > o.staging_bytes) break;
      staged_bytes += job.nbytes;
      const bool pin = job.dst.is_cuda();
      at::Tensor host = at::empty(job.dst.sizes(), at::TensorOptions().dtype(job.dst.scalar_type()).pinned_memory(pin));
      requests.push_back({TZ_READ_REQUEST_VERSION, job.index, dst_pointer(host), job.nbytes});
      staged.emplace_back(end, std::move(host));
    }
    check(tz_reader_read_batch(reader, requests.data(), requests.size(), flags, o.num_readers, nullptr));
    at::NoGradGuard no_grad;
    for (size_t k = next; k < end; ++k) {
      // Like an in-place op, so autograd notices tensors it saved were changed.
      if (jobs[k].direct && !jobs[k].dst.is_inference()) jobs[k].dst.unsafeGetTensorImpl()->bump_version();
    }
    for (auto& [k, host] : staged) {
      const bool to_cuda = jobs[k].dst.is_cuda();
      // Pinned memory makes the copy asynchronous; the caching host allocator
      // keeps the block until the copy is done.
      copyable(jobs[k].dst).copy_(copyable(host), /*non_blocking=*/to_cuda);
      copied_to_cuda |= to_cuda;
    }
    next = end;
  }
  if (copied_to_cuda) ::torch::cuda::synchronize();
}

// A read may go straight into a target only if its memory is exactly the
// tensor's bytes and no other read writes the same bytes (tied weights).
void choose_direct(std::vector<ReadJob>& jobs) {
  std::vector<std::tuple<uintptr_t, uintptr_t, size_t>> spans;
  for (size_t k = 0; k < jobs.size(); ++k) {
    const at::Tensor& t = jobs[k].dst;
    jobs[k].direct = t.device().is_cpu() && t.layout() == c10::kStrided && t.is_contiguous() && !t.is_conj() &&
                     !t.is_neg() && uint64_t(t.numel()) * t.element_size() == jobs[k].nbytes;
    if (jobs[k].direct && jobs[k].nbytes > 0) {
      const auto start = reinterpret_cast<uintptr_t>(t.data_ptr());
      spans.emplace_back(start, start + jobs[k].nbytes, k);
    }
  }
  std::sort(spans.begin(), spans.end());
  uintptr_t reach = 0;
  for (const auto& [start, end, k] : spans) {
    if (start < reach) jobs[k].direct = false;
    reach = std::max(reach, end);
  }
}

// ---- modules ----------------------------------------------------------------

struct ModuleTensor {
  std::string name;
  uint16_t module_index;
  TensorType type;
  at::Tensor tensor;
  const ::torch::nn::Module* owner;
};

// Python's write_module order: named_modules() (depth first, each module
// instance once), then per module its own parameters and buffers, each
// tensor once per module (named_parameters(recurse=False) deduplicates).
std::vector<ModuleTensor> module_tensors(const ::torch::nn::Module& root) {
  std::vector<std::pair<std::string, const ::torch::nn::Module*>> modules;
  std::unordered_set<const ::torch::nn::Module*> seen;
  std::function<void(const ::torch::nn::Module&, const std::string&)> visit = [&](const ::torch::nn::Module& m,
                                                                                 const std::string& prefix) {
    if (!seen.insert(&m).second) return;
    modules.emplace_back(prefix, &m);
    for (const auto& child : m.named_children()) {
      visit(*child.value(), prefix.empty() ? child.key() : prefix + "." + child.key());
    }
  };
  visit(root, "");
  if (modules.size() > 0x10000) fail(TZ_E_LIMIT, "more than 65536 modules: module indices are 16 bits");

  std::vector<ModuleTensor> out;
  for (size_t idx = 0; idx < modules.size(); ++idx) {
    const auto& [path, m] = modules[idx];
    std::unordered_set<const c10::TensorImpl*> params, buffers;
    for (const auto& p : m->named_parameters(/*recurse=*/false)) {
      if (params.insert(p.value().unsafeGetTensorImpl()).second)
        out.push_back({path + "." + p.key(), uint16_t(idx), TensorType::Param, p.value(), m});
    }
    for (const auto& b : m->named_buffers(/*recurse=*/false)) {
      if (b.value().defined() && buffers.insert(b.value().unsafeGetTensorImpl()).second)
        out.push_back({path + "." + b.key(), uint16_t(idx), TensorType::Buffer, b.value(), m});
    }
  }
  return out;
}

// Every name that reaches a module tensor, mapped to its module_tensors()
// entry: a shared submodule under each of its paths and a tensor under each
// attribute it is registered as, since state_dict() lists all of those.
std::unordered_map<std::string, size_t> module_names(const ::torch::nn::Module& root,
                                                     const std::vector<ModuleTensor>& tensors) {
  std::map<std::pair<const ::torch::nn::Module*, const c10::TensorImpl*>, size_t> entry;
  std::unordered_map<std::string, size_t> names;
  for (size_t k = 0; k < tensors.size(); ++k) {
    entry.emplace(std::make_pair(tensors[k].owner, tensors[k].tensor.unsafeGetTensorImpl()), k);
    names.emplace(tensors[k].name, k);
  }
  std::vector<const ::torch::nn::Module*> stack;  // guards against cycles
  std::function<void(const ::torch::nn::Module&, const std::string&)> visit = [&](const ::torch::nn::Module& m,
                                                                                 const std::string& prefix) {
    if (std::find(stack.begin(), stack.end(), &m) != stack.end()) return;
    stack.push_back(&m);
    const auto add = [&](const std::string& attr, const at::Tensor& t) {
      if (!t.defined()) return;
      auto it = entry.find({&m, t.unsafeGetTensorImpl()});
      if (it != entry.end()) names.emplace(prefix + "." + attr, it->second);
    };
    for (const auto& p : m.named_parameters(/*recurse=*/false)) add(p.key(), p.value());
    for (const auto& b : m.named_buffers(/*recurse=*/false)) add(b.key(), b.value());
    for (const auto& child : m.named_children()) {
      visit(*child.value(), prefix.empty() ? child.key() : prefix + "." + child.key());
    }
    stack.pop_back();
  };
  visit(root, "");
  return names;
}

std::string describe_names(const std::vector<std::string>& names) {
  std::string s;
  const size_t shown = std::min<size_t>(names.size(), 8);
  for (size_t k = 0; k < shown; ++k) s += (k ? ", '" : "'") + names[k] + "'";
  if (names.size() > shown) s += " and " + std::to_string(names.size() - shown) + " more";
  return s;
}

// ---- writing ------------------------------------------------------------------

struct Prepared {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  at::Tensor host;  // C-contiguous host bytes; undefined for meta tensors
  bool meta = false;
};

std::string encode_name(const Record& r) {
  if (r.path.empty()) {
    // Readers would take the name for a JSON-seq path (upstream's quirk).
    if (!r.name.empty() && r.name[0] == '\x1e') {
      fail(TZ_E_INVALID_ARG, "a plain tensor name may not start with 0x1E; give structured names as Record::path");
    }
    return r.name;
  }
  std::vector<tz_path_component> comps(r.path.size());
  for (size_t k = 0; k < r.path.size(); ++k) {
    if (const auto* s = std::get_if<std::string>(&r.path[k])) {
      comps[k].is_index = 0;
      comps[k].str = s->data();
      comps[k].str_len = s->size();
    } else {
      comps[k].is_index = 1;
      comps[k].index = std::get<uint64_t>(r.path[k]);
    }
  }
  size_t len = 0;
  check(tz_path_encode(nullptr, 0, &len, comps.data(), comps.size()));
  std::string out(len, '\0');
  check(tz_path_encode(reinterpret_cast<uint8_t*>(out.data()), out.size(), &len, comps.data(), comps.size()));
  return out;
}

Prepared prepare(const Record& r) {
  Prepared p;
  p.name = encode_name(r);
  const at::Tensor& t = r.tensor;
  if (!t.defined()) fail(TZ_E_INVALID_ARG, "tensor '" + r.name + "' is undefined");
  if (t.layout() != c10::kStrided) {
    fail(TZ_E_UNSUPPORTED, "tensor '" + r.name + "' is not a dense (strided) tensor");
  }
  p.dtype = dtype_string(t.scalar_type());
  for (int64_t d : t.sizes()) p.shape.push_back(uint64_t(d));
  if (t.is_meta()) {
    p.meta = true;
    return p;
  }
  at::Tensor h = t.detach();
  if (!h.device().is_cpu()) h = h.to(c10::kCPU);
  if (h.is_conj()) h = h.resolve_conj();
  if (h.is_neg()) h = h.resolve_neg();
  if (!h.is_contiguous()) h = copyable(h).contiguous().view(h.scalar_type());
  p.host = std::move(h);
  return p;
}

}  // namespace

// ---- Key ------------------------------------------------------------------------

Key::Key(tz_key* key) : key_(key, tz_key_free) {}

Key Key::random() {
  tz_key* k = nullptr;
  check(tz_key_new_random(&k));
  return Key(k);
}

Key Key::from_bytes(const void* key, size_t len) {
  tz_key* k = nullptr;
  check(tz_key_new_from_bytes(&k, key, len));
  return Key(k);
}

Key Key::derive(std::string_view password, uint64_t opslimit, uint64_t memlimit) {
  tz_key* k = nullptr;
  check(tz_key_new_derived(&k, password.data(), password.size(), opslimit, memlimit, nullptr, 0));
  return Key(k);
}

Key Key::password(std::string_view password) {
  tz_key* k = nullptr;
  check(tz_key_new_password(&k, password.data(), password.size()));
  return Key(k);
}

std::array<uint8_t, TZ_KEY_BYTES> Key::bytes() const {
  std::array<uint8_t, TZ_KEY_BYTES> out{};
  check(tz_key_get_bytes(out.data(), out.size(), key_.get()));
  return out;
}

// ---- dtypes -------------------------------------------------------------------

std::string dtype_string(c10::ScalarType type) {
  for (const DType& q : kQuantized) {
    if (q.type == type) fail(TZ_E_UNSUPPORTED, std::string("Serialization for torch.") + q.name + " is not implemented.");
  }
  const DType* d = find_dtype(type);
  if (d == nullptr) fail(TZ_E_UNSUPPORTED, std::string("no tensorizer dtype for ") + c10::toString(type));
  if (d->numpy != nullptr) return d->numpy;
  const size_t size = c10::elementSize(type);
  std::string s = size == 1 ? "|V1" : "<V" + std::to_string(size);
  s += '\0';
  return s + "torch." + d->name;
}

c10::ScalarType scalar_type_from_dtype(std::string_view dtype) {
  const size_t sep = dtype.find('\0');
  const std::string_view np = dtype.substr(0, sep);
  std::string_view torch_part;
  if (sep != std::string_view::npos) {
    torch_part = dtype.substr(sep + 1);
    if (torch_part.find('\0') != std::string_view::npos)
      fail(TZ_E_FORMAT, "multiple opaque dtype separators in a dtype string");
  }
  const size_t kind_at = (!np.empty() && std::strchr("<>|=", np[0]) != nullptr) ? 1 : 0;
  if (kind_at >= np.size() || np[kind_at] != 'V') return native_type(np);

  // Opaque: "<V2\0torch.bfloat16" - the torch name says what the bytes are.
  const std::string readable(np);
  if (torch_part.empty()) {
    fail(TZ_E_FORMAT, "Tried to decode a tensor stored as opaque data, but no torch dtype was specified");
  }
  const std::string_view prefix = "torch.";
  if (torch_part.substr(0, prefix.size()) != prefix) fail(TZ_E_FORMAT, "Invalid torch_dtype: " + std::string(torch_part));
  const std::string_view name = torch_part.substr(prefix.size());
  for (const DType& q : kQuantized) {
    if (name == q.name) fail(TZ_E_UNSUPPORTED, "Deserialization for torch." + std::string(name) + " is not implemented.");
  }
  for (const DType& d : kDTypes) {
    if (name != d.name) continue;
    const std::string digits = readable.substr(kind_at + 1);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 2 ||
        size_t(std::stoi(digits)) != c10::elementSize(d.type)) {
      fail(TZ_E_FORMAT, "Invalid opaque dtype '" + readable + "' for torch." + d.name);
    }
    return d.type;
  }
  fail(TZ_E_UNSUPPORTED, "Invalid torch_dtype: " + std::string(torch_part));
}

// ---- saving ---------------------------------------------------------------------

void save(const std::string& uri, const std::vector<Record>& records, const SaveOptions& options) {
  std::vector<Prepared> prepared;
  prepared.reserve(records.size());
  for (const Record& r : records) prepared.push_back(prepare(r));

  std::vector<tz_tensor_desc> descs(records.size());
  for (size_t k = 0; k < records.size(); ++k) {
    const Prepared& p = prepared[k];
    tz_tensor_desc& d = descs[k];
    d.version = TZ_TENSOR_DESC_VERSION;
    d.name = reinterpret_cast<const uint8_t*>(p.name.data());
    d.name_len = p.name.size();
    d.dtype = p.dtype.data();
    d.dtype_len = p.dtype.size();
    d.ndim = uint32_t(p.shape.size());
    d.shape = p.shape.data();
    d.module_index = records[k].module_index;
    d.tensor_type = int32_t(records[k].type);
    d.is_meta = p.meta ? 1 : 0;
    if (!p.meta) {
      d.data = p.host.data_ptr();
      d.data_size = uint64_t(p.host.numel()) * p.host.element_size();
    }
  }

  OptionsPtr opts = make_options(options.key, options.options, options.num_threads, false);
  tz_writer* raw = nullptr;
  check(tz_writer_open(&raw, uri.c_str(), opts.get()));
  WriterPtr writer(raw, tz_writer_free);
  check(tz_writer_write(raw, descs.data(), descs.size(), options.num_threads));
  check(tz_writer_close(raw));
}

void save_module(const std::string& uri, const ::torch::nn::Module& module, const SaveOptions& options) {
  std::vector<Record> records;
  for (ModuleTensor& t : module_tensors(module)) {
    records.push_back({std::move(t.name), {}, t.type, t.module_index, std::move(t.tensor)});
  }
  save(uri, records, options);
}

void save_state_dict(const std::string& uri, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                     const SaveOptions& options) {
  std::vector<Record> records;
  records.reserve(tensors.size());
  for (const auto& [name, t] : tensors) records.push_back({name, {}, TensorType::StateDict, 0, t});
  save(uri, records, options);
}

void save_state_dict(const std::string& uri, const ::torch::OrderedDict<std::string, at::Tensor>& tensors,
                     const SaveOptions& options) {
  std::vector<std::pair<std::string, at::Tensor>> pairs;
  pairs.reserve(tensors.size());
  for (const auto& item : tensors) pairs.emplace_back(item.key(), item.value());
  save_state_dict(uri, pairs, options);
}

// ---- loading --------------------------------------------------------------------

std::vector<Record> load(const std::string& uri, const LoadOptions& options) {
  const c10::Device device = options.device;
  if (device.is_cuda() && !cuda_available()) {
    fail(TZ_E_UNSUPPORTED, "Cannot deserialize to CUDA device because CUDA is not available");
  }
  ReaderSession s = open_reader(uri, options);
  std::vector<Stored> selected;
  std::vector<ReadJob> jobs;
  for (uint64_t i = 0; i < s.count; ++i) {
    std::optional<Stored> found = describe(s.reader.get(), i, options.filter);
    if (!found) continue;
    Stored& st = *found;
    at::Tensor dst = at::empty(st.shape, at::TensorOptions().dtype(st.dtype).device(device));
    jobs.push_back({i, std::move(dst), st.nbytes, false});
    selected.push_back(std::move(st));
  }
  choose_direct(jobs);
  run_jobs(s.reader.get(), jobs, options);

  std::vector<Record> out;
  out.reserve(jobs.size());
  for (size_t k = 0; k < jobs.size(); ++k) {
    tz_tensor_info info{};
    info.version = TZ_TENSOR_INFO_VERSION;
    check(tz_reader_tensor_info(&info, s.reader.get(), jobs[k].index));  // module_index is known once read
    Stored& st = selected[k];
    out.push_back({std::move(st.name), std::move(st.path), st.type, uint16_t(std::max(info.module_index, 0)),
                   std::move(jobs[k].dst)});
  }
  return out;
}

::torch::OrderedDict<std::string, at::Tensor> load_state_dict(const std::string& uri, const LoadOptions& options) {
  ::torch::OrderedDict<std::string, at::Tensor> out("Tensor");
  for (Record& r : load(uri, options)) {
    if (out.contains(r.name)) fail(TZ_E_CONFLICT, "two stored tensors are both named '" + r.name + "'");
    out.insert(std::move(r.name), std::move(r.tensor));
  }
  return out;
}

size_t load_into_module(const std::string& uri, ::torch::nn::Module& module, const LoadOptions& options) {
  const std::vector<ModuleTensor> targets = module_tensors(module);
  const std::unordered_map<std::string, size_t> by_name = module_names(module, targets);
  std::vector<bool> loaded(targets.size(), false);

  ReaderSession s = open_reader(uri, options);
  std::vector<ReadJob> jobs;
  std::vector<std::string> unknown;
  for (uint64_t i = 0; i < s.count; ++i) {
    std::optional<Stored> found = describe(s.reader.get(), i, options.filter);
    if (!found) continue;
    const Stored& st = *found;
    if (!st.plain) {
      fail(TZ_E_UNSUPPORTED, "tensor '" + st.name + "' has a structured path, which names no module tensor");
    }
    auto it = by_name.find(st.name);
    if (it == by_name.end() && st.name.find('.') == std::string::npos) it = by_name.find("." + st.name);
    if (it == by_name.end()) {
      unknown.push_back(st.name);
      continue;
    }
    const ModuleTensor& target = targets[it->second];
    loaded[it->second] = true;
    if (target.tensor.sizes() != c10::IntArrayRef(st.shape)) {
      fail(TZ_E_INVALID_ARG, "tensor '" + st.name + "' has shape " + shape_string(st.shape) + " in the file but " +
                                 shape_string(target.tensor.sizes()) + " in the module");
    }
    if (target.tensor.scalar_type() != st.dtype) {
      fail(TZ_E_INVALID_ARG, "tensor '" + st.name + "' is " + c10::toString(st.dtype) + " in the file but " +
                                 c10::toString(target.tensor.scalar_type()) + " in the module");
    }
    // Several names for one tensor (aliases) all load; the last in file order wins.
    jobs.push_back({i, target.tensor, st.nbytes, false});
  }
  if (!unknown.empty()) {
    fail(TZ_E_NOT_FOUND, "the module has no parameter or buffer for the stored tensor" +
                             std::string(unknown.size() > 1 ? "s " : " ") + describe_names(unknown));
  }
  if (options.strict) {
    std::vector<std::string> missing;
    for (size_t k = 0; k < targets.size(); ++k)
      if (!loaded[k]) missing.push_back(targets[k].name);
    if (!missing.empty()) {
      fail(TZ_E_NOT_FOUND, "the file has no tensor for the module's " + describe_names(missing) +
                               " (strict loading; set LoadOptions::strict = false to allow)");
    }
  }
  choose_direct(jobs);
  run_jobs(s.reader.get(), jobs, options);
  return jobs.size();
}

}  // namespace torch
}  // namespace tensorizer
