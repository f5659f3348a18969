// tensorizer/torch.hpp - save and load libtorch modules and tensors in the
// tensorizer (|TZR|) format, on top of the C ABI in <tensorizer.h>.
//
// Files are interchangeable with the Python package and upstream tensorizer:
//  - save_module writes what Python's TensorSerializer.write_module writes:
//    module index = position of the owning submodule in named_modules()
//    order (root 0, depth first, a shared submodule listed once), per module
//    its own parameters (PARAM) then its own buffers (BUFFER), named
//    "<module path>.<attr>" (so root tensors get a leading dot: ".weight").
//  - save_state_dict writes what write_state_dict writes for a flat dict:
//    module index 0, type STATE_DICT, the keys as plain names.
//  - dtype strings are the Python package's (FORMAT.md §4.4), e.g. "<f4",
//    "<V2\0torch.bfloat16", "|V1\0torch.float8_e4m3fn".
//
// Errors are thrown as tensorizer::torch::Error carrying a TZ_E_* code;
// failures inside libtorch itself (allocation, copies) surface as c10::Error.
//
// Names inside namespace tensorizer::torch that mean libtorch are spelled
// ::torch:: (or at::, c10::) to avoid the clash with this namespace.
#pragma once

#include <tensorizer.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/ordered_dict.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#if defined(__GNUC__)
#define TZ_TORCH_API __attribute__((visibility("default")))
#else
#define TZ_TORCH_API
#endif

namespace tensorizer {
namespace torch {

// A failure, with the TZ_E_* code from <tensorizer.h>. Codes used by this
// library itself: TZ_E_NOT_FOUND (a file tensor the module lacks, or with
// strict loading a module tensor the file lacks), TZ_E_INVALID_ARG (shape or
// dtype mismatch, bad argument), TZ_E_UNSUPPORTED (a dtype with no tensorizer
// encoding such as quantized types, sparse tensors, CUDA not available,
// structured paths for a module), TZ_E_CONFLICT (two stored paths give the
// same joined name in load_state_dict; the writer's duplicate names). Everything else comes from
// libtensorizer with its message (TZ_E_HASH, TZ_E_CRYPTO, TZ_E_IO...).
class TZ_TORCH_API Error : public std::runtime_error {
 public:
  Error(int code, const std::string& message);
  int code() const noexcept { return code_; }
  // Symbolic name of code(), e.g. "TZ_E_HASH".
  const char* code_name() const noexcept;

 private:
  int code_;
};

enum class TensorType : int32_t {
  Param = TZ_TENSOR_PARAM,
  Buffer = TZ_TENSOR_BUFFER,
  StateDict = TZ_TENSOR_STATE_DICT,
};

// An encryption key (a shared reference to a tz_key held in guarded memory).
class TZ_TORCH_API Key {
 public:
  static Key random();
  // Exactly TZ_KEY_BYTES bytes.
  static Key from_bytes(const void* key, size_t len);
  // Argon2id from a password with a random salt, for writing; the limits and
  // salt are stored in the file. Defaults are upstream's (MODERATE).
  static Key derive(std::string_view password, uint64_t opslimit = TZ_OPSLIMIT_MODERATE,
                    uint64_t memlimit = TZ_MEMLIMIT_MODERATE);
  // A password for reading: each file's key is derived from what it stores.
  static Key password(std::string_view password);

  // The 32 key bytes (Error TZ_E_STATE for a password() key).
  std::array<uint8_t, TZ_KEY_BYTES> bytes() const;
  const tz_key* get() const noexcept { return key_.get(); }

 private:
  explicit Key(tz_key* key);
  std::shared_ptr<tz_key> key_;
};

// One component of a stored tensor path: a string key or a list index.
using PathComponent = std::variant<std::string, uint64_t>;

// One stored tensor, as read by load() or to be written by save().
struct Record {
  // The name: a plain stored name as is; a structured path's components
  // joined with '.' (["enc", "layers", 1, "b"] -> "enc.layers.1.b").
  // When writing, used (as a plain name) only if `path` is empty.
  std::string name;
  // The stored path (one string component for a plain name). When writing,
  // a non-empty path is encoded as upstream does (STATE_DICT only).
  std::vector<PathComponent> path;
  TensorType type = TensorType::StateDict;
  uint16_t module_index = 0;
  at::Tensor tensor;
};

struct SaveOptions {
  std::optional<Key> key;        // encrypt with this key (not a password() key)
  unsigned num_threads = 0;      // hashing/writing threads; 0: CPU count
  // Further writer options for tz_options_set, e.g. {"crypt_chunk_size", "1048576"}.
  std::vector<std::pair<std::string, std::string>> options;
};

struct LoadOptions {
  // Where load() and load_state_dict() put tensors. CUDA tensors are read
  // into pinned host memory (at most staging_bytes at a time, or one tensor)
  // and copied over; Error TZ_E_UNSUPPORTED when CUDA is not available.
  // load_into_module ignores it: each tensor goes to its target's device.
  c10::Device device = c10::kCPU;
  bool verify_hash = false;      // check every stored CRC32/SHA-256 while reading
  unsigned num_readers = 0;      // reader threads; 0: CPU count
  std::optional<Key> key;        // decrypt (random/from_bytes/derive/password key)
  // Selects tensors by Record::name; unselected ones are not read at all.
  std::function<bool(const std::string& name)> filter;
  // load_into_module: every parameter and buffer of the module must be loaded
  // (a filter that leaves some out needs strict = false).
  bool strict = true;
  size_t staging_bytes = size_t(256) << 20;
  // Further reader options for tz_options_set (http_headers, direct_io...).
  std::vector<std::pair<std::string, std::string>> options;
};

// ---- Saving (the file is created or truncated; written in one parallel call)
// dtypes are checked and tensors copied to the host before the file is
// opened; libtensorizer checks names and shapes after, so a save refused
// there leaves a file with no tensors, which readers reject.

// Every parameter and buffer of `module` and its submodules, as write_module.
// Tied tensors are written once per name, as upstream does. Meta tensors are
// stored as meta (shape and dtype only); tensors on other devices are copied
// to the host first.
TZ_TORCH_API void save_module(const std::string& uri, const ::torch::nn::Module& module,
                              const SaveOptions& options = {});
template <typename M>
void save_module(const std::string& uri, const ::torch::nn::ModuleHolder<M>& module,
                 const SaveOptions& options = {}) {
  save_module(uri, *module, options);
}

// A flat name -> tensor map as STATE_DICT tensors in map order. A name must
// not be empty or start with 0x1E (readers could not get it back).
TZ_TORCH_API void save_state_dict(const std::string& uri,
                                  const ::torch::OrderedDict<std::string, at::Tensor>& tensors,
                                  const SaveOptions& options = {});
TZ_TORCH_API void save_state_dict(const std::string& uri,
                                  const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                  const SaveOptions& options = {});

// Any records, in order (like TensorSerializer.write_tensor, and structured
// paths like write_state_dict on nested containers).
TZ_TORCH_API void save(const std::string& uri, const std::vector<Record>& records,
                       const SaveOptions& options = {});

// ---- Loading

// Copies the file's tensors into the module's existing parameters and
// buffers, matched by name like load_into_module: "<module path>.<attr>"
// (".<attr>" for the root, as save_module writes). A name without a dot also
// matches a root tensor, so state_dict() keys saved with save_state_dict or
// Python's write_state_dict load too. A tensor reachable under several names
// (a submodule registered twice, a tensor under two attributes) answers to
// each; if the file has several of them, the last in file order wins. The
// stored tensor type (parameter vs buffer) is not checked, and module indices
// are ignored. Unlike upstream, tensors are copied into place (devices, tied
// weights and requires_grad are kept) rather than re-registered.
// Checked before any byte is read, so the module is untouched when they fail:
//  - a selected file tensor with no such parameter/buffer: TZ_E_NOT_FOUND;
//  - shape or dtype differs from the target's: TZ_E_INVALID_ARG (no casts);
//  - a structured (non-plain) stored name: TZ_E_UNSUPPORTED;
//  - strict, and a parameter/buffer receives nothing: TZ_E_NOT_FOUND.
// A read failure (hash, decryption, I/O) may leave some tensors loaded.
// Contiguous CPU targets are read into directly. Returns the tensors loaded.
TZ_TORCH_API size_t load_into_module(const std::string& uri, ::torch::nn::Module& module,
                                     const LoadOptions& options = {});
template <typename M>
size_t load_into_module(const std::string& uri, ::torch::nn::ModuleHolder<M>& module,
                        const LoadOptions& options = {}) {
  return load_into_module(uri, *module, options);
}

// Every selected tensor in file order, with name, path, type and module index.
TZ_TORCH_API std::vector<Record> load(const std::string& uri, const LoadOptions& options = {});

// name -> tensor in file order (Record::name as the key).
TZ_TORCH_API ::torch::OrderedDict<std::string, at::Tensor> load_state_dict(
    const std::string& uri, const LoadOptions& options = {});

// ---- dtypes (FORMAT.md §4.4)

// The dtype string stored for `type`, e.g. "<f4" or "<V2\0torch.bfloat16"
// (with its NUL). Error TZ_E_UNSUPPORTED for quantized and unknown types.
TZ_TORCH_API std::string dtype_string(c10::ScalarType type);
// The scalar type a stored dtype string decodes to (byte order is handled by
// libtensorizer on read). Error TZ_E_UNSUPPORTED / TZ_E_FORMAT otherwise.
TZ_TORCH_API c10::ScalarType scalar_type_from_dtype(std::string_view dtype);

}  // namespace torch
}  // namespace tensorizer
