// Tests of tz-torch (tensorizer::torch). The hidden [.cross] case is run by
// tests/test_tz_torch.py against files written by the Python package and
// upstream; it writes files for the Python side to check in turn.
#include <tensorizer/torch.hpp>
#include <torch/cuda.h>
// libtorch's c10/util/Logging.h defines a glog-style CHECK (abort on
// failure); Catch's must win, so it comes last.
#undef CHECK
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace tt = tensorizer::torch;
using ST = c10::ScalarType;

namespace {

std::string temp_path(const std::string& name) {
  return "/tmp/tz_torch_test_" + std::to_string(::getpid()) + "_" + name;
}

std::vector<char> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void spit(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// Deterministic contents, the same as tests/tz_torch_cross.py builds:
// byte i = (7 i + 3 + 11 seed) mod 256 (bool: (i + seed) mod 2), viewed as dtype.
at::Tensor pattern(ST dtype, std::vector<int64_t> shape, int seed) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const int64_t nbytes = numel * int64_t(c10::elementSize(dtype));
  at::Tensor bytes = dtype == ST::Bool ? at::arange(nbytes, at::kLong).add(seed).remainder(2)
                                       : at::arange(nbytes, at::kLong).mul(7).add(3 + 11 * seed).remainder(256);
  return bytes.to(at::kByte).view(dtype).reshape(shape);
}

// Same shape, dtype and bytes (NaN-proof: compares memory).
bool same(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.cpu(), y = b.cpu();
  REQUIRE(x.is_contiguous());
  REQUIRE(y.is_contiguous());
  return std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.numel()) * x.element_size()) == 0;
}

at::Tensor blank_like(const at::Tensor& t) {
  at::Tensor out = at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()));
  if (out.numel() > 0) std::memset(out.data_ptr(), 0, size_t(out.numel()) * out.element_size());
  return out;
}

// A function, so Catch does not try to print the vectors (libtorch's
// operator<< for std::vector cannot print a variant).
bool path_is(const tt::Record& r, const std::vector<tt::PathComponent>& path) { return r.path == path; }

template <typename F>
int error_code(F&& f) {
  try {
    f();
  } catch (const tt::Error& e) {
    INFO(e.what());
    return e.code();
  }
  return TZ_OK;
}

std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const tt::Error& e) {
    return e.what();
  }
  return "";
}

struct DTypeCase {
  const char* name;
  ST type;
  std::string stored;
};

// The dtypes in tests/tz_torch_cross.py's order, with the strings the Python
// package writes (tensorizer._dtypes.dtype_string_for_torch).
std::vector<DTypeCase> dtype_cases() {
  using namespace std::string_literals;
  return {
      {"float16", ST::Half, "<f2"},
      {"float32", ST::Float, "<f4"},
      {"float64", ST::Double, "<f8"},
      {"bfloat16", ST::BFloat16, "<V2\0torch.bfloat16"s},
      {"complex32", ST::ComplexHalf, "<V4\0torch.complex32"s},
      {"complex64", ST::ComplexFloat, "<c8"},
      {"complex128", ST::ComplexDouble, "<c16"},
      {"int8", ST::Char, "|i1"},
      {"int16", ST::Short, "<i2"},
      {"int32", ST::Int, "<i4"},
      {"int64", ST::Long, "<i8"},
      {"uint8", ST::Byte, "|u1"},
      {"uint16", ST::UInt16, "<u2"},
      {"uint32", ST::UInt32, "<u4"},
      {"uint64", ST::UInt64, "<u8"},
      {"bool", ST::Bool, "|b1"},
      {"float8_e4m3fn", ST::Float8_e4m3fn, "|V1\0torch.float8_e4m3fn"s},
      {"float8_e5m2", ST::Float8_e5m2, "|V1\0torch.float8_e5m2"s},
      {"float8_e4m3fnuz", ST::Float8_e4m3fnuz, "|V1\0torch.float8_e4m3fnuz"s},
      {"float8_e5m2fnuz", ST::Float8_e5m2fnuz, "|V1\0torch.float8_e5m2fnuz"s},
      {"float8_e8m0fnu", ST::Float8_e8m0fnu, "|V1\0torch.float8_e8m0fnu"s},
      {"float4_e2m1fn_x2", ST::Float4_e2m1fn_x2, "|V1\0torch.float4_e2m1fn_x2"s},
      {"bits8", ST::Bits8, "|V1\0torch.bits8"s},
      {"bits16", ST::Bits16, "<V2\0torch.bits16"s},
      {"bits1x8", ST::Bits1x8, "|V1\0torch.bits1x8"s},
      {"bits2x4", ST::Bits2x4, "|V1\0torch.bits2x4"s},
      {"bits4x2", ST::Bits4x2, "|V1\0torch.bits4x2"s},
      {"uint1", ST::UInt1, "|V1\0torch.uint1"s},
      {"uint2", ST::UInt2, "|V1\0torch.uint2"s},
      {"uint3", ST::UInt3, "|V1\0torch.uint3"s},
      {"uint4", ST::UInt4, "|V1\0torch.uint4"s},
      {"uint5", ST::UInt5, "|V1\0torch.uint5"s},
      {"uint6", ST::UInt6, "|V1\0torch.uint6"s},
      {"uint7", ST::UInt7, "|V1\0torch.uint7"s},
      {"int1", ST::Int1, "|V1\0torch.int1"s},
      {"int2", ST::Int2, "|V1\0torch.int2"s},
      {"int3", ST::Int3, "|V1\0torch.int3"s},
      {"int4", ST::Int4, "|V1\0torch.int4"s},
      {"int5", ST::Int5, "|V1\0torch.int5"s},
      {"int6", ST::Int6, "|V1\0torch.int6"s},
      {"int7", ST::Int7, "|V1\0torch.int7"s},
  };
}

std::vector<std::pair<std::string, at::Tensor>> dtype_state_dict() {
  std::vector<std::pair<std::string, at::Tensor>> sd;
  int seed = 0;
  for (const DTypeCase& c : dtype_cases()) sd.emplace_back(c.name, pattern(c.type, {3, 2}, seed++));
  return sd;
}

// The module of tests/tz_torch_cross.py: tensors in every position
// write_module distinguishes (root, nested, params, buffers, a submodule
// registered twice), filled with pattern() or zeros.
struct InnerImpl : torch::nn::Module {
  explicit InnerImpl(bool fill) {
    register_parameter("b", fill ? pattern(ST::ComplexFloat, {2, 2}, 6) : blank_like(pattern(ST::ComplexFloat, {2, 2}, 6)),
                       false);
  }
};
TORCH_MODULE(Inner);

at::Tensor value(bool fill, ST dtype, std::vector<int64_t> shape, int seed) {
  at::Tensor t = pattern(dtype, std::move(shape), seed);
  return fill ? t : blank_like(t);
}

struct EncImpl : torch::nn::Module {
  explicit EncImpl(bool fill) {
    register_parameter("w", value(fill, ST::Half, {4, 2}, 3), false);
    register_buffer("mask", value(fill, ST::Bool, {5}, 4));
    register_buffer("scale", value(fill, ST::Float8_e4m3fn, {2}, 5));
    inner = register_module("inner", Inner(fill));
  }
  Inner inner{nullptr};
};
TORCH_MODULE(Enc);

struct DecImpl : torch::nn::Module {
  explicit DecImpl(bool fill) {
    register_parameter("w", value(fill, ST::Double, {3}, 7), false);
    register_parameter("z", value(fill, ST::Float, {0, 4}, 8), false);
    register_buffer("cplx", value(fill, ST::ComplexHalf, {2}, 9));
  }
};
TORCH_MODULE(Dec);

struct DemoImpl : torch::nn::Module {
  explicit DemoImpl(bool fill) {
    register_parameter("weight", value(fill, ST::Float, {2, 3}, 0), false);
    register_parameter("bias", value(fill, ST::BFloat16, {3}, 1), false);
    register_buffer("steps", value(fill, ST::Long, {}, 2));
    enc = register_module("enc", Enc(fill));
    dec = register_module("dec", Dec(fill));
    register_module("tied", enc->inner);  // listed once by named_modules()
  }
  Enc enc{nullptr};
  Dec dec{nullptr};
};
TORCH_MODULE(Demo);

struct Expected {
  const char* name;
  int module_index;
  int type;
};

const std::vector<Expected> kDemoLayout = {
    {".weight", 0, TZ_TENSOR_PARAM},   {".bias", 0, TZ_TENSOR_PARAM},       {".steps", 0, TZ_TENSOR_BUFFER},
    {"enc.w", 1, TZ_TENSOR_PARAM},     {"enc.mask", 1, TZ_TENSOR_BUFFER},   {"enc.scale", 1, TZ_TENSOR_BUFFER},
    {"enc.inner.b", 2, TZ_TENSOR_PARAM}, {"dec.w", 3, TZ_TENSOR_PARAM},     {"dec.z", 3, TZ_TENSOR_PARAM},
    {"dec.cplx", 3, TZ_TENSOR_BUFFER},
};

void check_same_module(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.keys() == pb.keys());
  for (const auto& item : pa) {
    INFO(item.key());
    CHECK(same(item.value(), pb[item.key()]));
  }
  const auto ba = a.named_buffers(), bb = b.named_buffers();
  REQUIRE(ba.keys() == bb.keys());
  for (const auto& item : ba) {
    INFO(item.key());
    CHECK(same(item.value(), bb[item.key()]));
  }
}

void check_demo_layout(const std::vector<tt::Record>& records) {
  REQUIRE(records.size() == kDemoLayout.size());
  for (size_t k = 0; k < records.size(); ++k) {
    INFO(kDemoLayout[k].name);
    CHECK(records[k].name == kDemoLayout[k].name);
    CHECK(int(records[k].module_index) == kDemoLayout[k].module_index);
    CHECK(int(records[k].type) == kDemoLayout[k].type);
  }
}

// The stored dtype strings, read through the C ABI.
std::vector<std::string> stored_dtypes(const std::string& path) {
  tz_reader* r = nullptr;
  REQUIRE(tz_reader_open(&r, path.c_str(), nullptr) == TZ_OK);
  uint64_t n = 0;
  REQUIRE(tz_reader_tensor_count(&n, r) == TZ_OK);
  std::vector<std::string> out;
  for (uint64_t i = 0; i < n; ++i) {
    tz_tensor_info info{};
    info.version = TZ_TENSOR_INFO_VERSION;
    REQUIRE(tz_reader_tensor_info(&info, r, i) == TZ_OK);
    out.emplace_back(info.dtype, info.dtype_len);
  }
  tz_reader_free(r);
  return out;
}

}  // namespace

TEST_CASE("dtype strings are the Python package's") {
  for (const DTypeCase& c : dtype_cases()) {
    INFO(c.name);
    CHECK(tt::dtype_string(c.type) == c.stored);
    CHECK(tt::scalar_type_from_dtype(c.stored) == c.type);
  }
  using namespace std::string_literals;
  CHECK(tt::scalar_type_from_dtype(">f4") == ST::Float);  // libtensorizer swaps on read
  CHECK(tt::scalar_type_from_dtype("=i2") == ST::Short);
  CHECK(tt::scalar_type_from_dtype("<f4\0torch.bfloat16"s) == ST::Float);  // suffix ignored when not opaque
  CHECK(error_code([] { tt::dtype_string(ST::QInt8); }) == TZ_E_UNSUPPORTED);
  CHECK(error_message([] { tt::dtype_string(ST::QUInt8); }) == "Serialization for torch.quint8 is not implemented.");
  CHECK(error_code([] { tt::scalar_type_from_dtype("|V1\0torch.qint8"s); }) == TZ_E_UNSUPPORTED);
  CHECK(error_code([] { tt::scalar_type_from_dtype("<V2"); }) == TZ_E_FORMAT);
  CHECK(error_code([] { tt::scalar_type_from_dtype("<V2\0torch.bfloat16\0x"s); }) == TZ_E_FORMAT);
  CHECK(error_code([] { tt::scalar_type_from_dtype("<V2\0numpy.bfloat16"s); }) == TZ_E_FORMAT);
  CHECK(error_code([] { tt::scalar_type_from_dtype("<V4\0torch.bfloat16"s); }) == TZ_E_FORMAT);
  CHECK(error_code([] { tt::scalar_type_from_dtype("<V2\0torch.nonsense"s); }) == TZ_E_UNSUPPORTED);
  CHECK(error_code([] { tt::scalar_type_from_dtype("<f16"); }) == TZ_E_UNSUPPORTED);
  CHECK(error_code([] { tt::scalar_type_from_dtype("<x4"); }) == TZ_E_UNSUPPORTED);
  CHECK(error_code([] { tt::scalar_type_from_dtype(""); }) == TZ_E_FORMAT);
}

TEST_CASE("every dtype round-trips through save_state_dict and load_state_dict") {
  const std::string path = temp_path("dtypes.tensors");
  const auto sd = dtype_state_dict();
  tt::save_state_dict(path, sd);
  const auto stored = stored_dtypes(path);
  const auto cases = dtype_cases();
  REQUIRE(stored.size() == cases.size());
  for (size_t k = 0; k < cases.size(); ++k) CHECK(stored[k] == cases[k].stored);

  tt::LoadOptions o;
  o.verify_hash = true;
  o.num_readers = 3;
  const auto loaded = tt::load_state_dict(path, o);
  REQUIRE(loaded.size() == sd.size());
  for (size_t k = 0; k < sd.size(); ++k) {
    INFO(sd[k].first);
    CHECK(loaded[sd[k].first].is_contiguous());
    CHECK(same(loaded[sd[k].first], sd[k].second));
    CHECK(loaded.keys()[k] == sd[k].first);
  }
  std::remove(path.c_str());
}

TEST_CASE("save_module writes write_module's names, module indices and types") {
  const std::string path = temp_path("module.tensors");
  Demo demo(true);
  tt::SaveOptions so;
  so.num_threads = 2;
  tt::save_module(path, demo, so);  // the ModuleHolder overload
  const auto records = tt::load(path);
  check_demo_layout(records);
  CHECK(path_is(records[0], {std::string(".weight")}));
  CHECK(same(records[6].tensor, demo->enc->inner->named_parameters()["b"]));
  std::remove(path.c_str());
}

TEST_CASE("load_into_module copies into the module's own tensors") {
  const std::string path = temp_path("into.tensors");
  Demo src(true);
  tt::save_module(path, *src);
  Demo dst(false);
  const at::Tensor weight = dst->named_parameters()["weight"];
  const void* before = weight.data_ptr();
  const auto version = weight._version();
  tt::LoadOptions o;
  o.verify_hash = true;
  CHECK(tt::load_into_module(path, dst, o) == kDemoLayout.size());
  check_same_module(*src, *dst);
  CHECK(dst->named_parameters()["weight"].data_ptr() == before);  // read in place
  CHECK(weight._version() > version);
  CHECK_FALSE(dst->named_parameters()["weight"].requires_grad());

  SECTION("a tensor registered twice (tied) loads into both names") {
    struct Tied : torch::nn::Module {
      Tied(at::Tensor shared, std::shared_ptr<torch::nn::Module> child) {
        register_parameter("a", shared);
        register_module("child", child);
      }
    };
    auto child = std::make_shared<torch::nn::Module>();
    at::Tensor shared = pattern(ST::Float, {4}, 1).requires_grad_(true);
    child->register_parameter("a", shared);
    Tied m(shared, child);
    const std::string tied = temp_path("tied.tensors");
    tt::save_module(tied, m);
    CHECK(tt::load(tied).size() == 2);  // once per name, as upstream
    at::Tensor zero = blank_like(shared).requires_grad_(true);
    auto child2 = std::make_shared<torch::nn::Module>();
    child2->register_parameter("a", zero);
    Tied m2(zero, child2);
    CHECK(tt::load_into_module(tied, m2) == 2);
    CHECK(same(zero.detach(), shared.detach()));
    CHECK(zero.requires_grad());
    std::remove(tied.c_str());
  }

  SECTION("non-contiguous targets are filled through staging, in small batches") {
    struct Strided : torch::nn::Module {
      explicit Strided(bool fill) {
        register_parameter("t", fill ? pattern(ST::Float, {3, 5}, 2) : blank_like(pattern(ST::Float, {5, 3}, 2)).t(),
                           false);
        register_buffer("b", value(fill, ST::BFloat16, {64}, 3));
        // No copy kernel of its own in libtorch.
        register_buffer("u4", fill ? pattern(ST::UInt4, {2, 3}, 4) : blank_like(pattern(ST::UInt4, {3, 2}, 4)).t());
      }
    };
    Strided a(true), b(false);
    REQUIRE_FALSE(b.named_parameters()["t"].is_contiguous());
    const std::string p2 = temp_path("strided.tensors");
    tt::save_module(p2, a);
    tt::LoadOptions small;
    small.staging_bytes = 16;
    CHECK(tt::load_into_module(p2, b, small) == 3);
    CHECK(at::equal(b.named_parameters()["t"], a.named_parameters()["t"]));
    CHECK(same(b.named_buffers()["b"], a.named_buffers()["b"]));
    CHECK(same(b.named_buffers()["u4"].view(ST::Char).contiguous(), a.named_buffers()["u4"].view(ST::Char)));
    // And a non-contiguous one is saved by value.
    tt::save_state_dict(p2, std::vector<std::pair<std::string, at::Tensor>>{{"u4t", a.named_buffers()["u4"].t()}});
    CHECK(same(tt::load_state_dict(p2)["u4t"].view(ST::Char),
               a.named_buffers()["u4"].view(ST::Char).t().contiguous()));
    std::remove(p2.c_str());
  }
  std::remove(path.c_str());
}

TEST_CASE("load_into_module refuses files that do not fit the module, before reading") {
  const std::string path = temp_path("mismatch.tensors");
  Demo src(true);
  tt::save_module(path, src);

  SECTION("a stored tensor the module lacks") {
    struct Small : torch::nn::Module {
      Small() { register_parameter("weight", blank_like(pattern(ST::Float, {2, 3}, 0))); }
    };
    Small m;
    tt::LoadOptions o;
    o.strict = false;
    CHECK(error_code([&] { tt::load_into_module(path, m, o); }) == TZ_E_NOT_FOUND);
    CHECK(error_message([&] { tt::load_into_module(path, m, o); }).find("'.bias'") != std::string::npos);
    CHECK(same(m.named_parameters()["weight"], blank_like(pattern(ST::Float, {2, 3}, 0))));  // untouched
    o.filter = [](const std::string& name) { return name == ".weight"; };
    CHECK(tt::load_into_module(path, m, o) == 1);
    CHECK(same(m.named_parameters()["weight"], pattern(ST::Float, {2, 3}, 0)));
  }
  SECTION("a module tensor the file lacks (strict)") {
    Demo m(false);
    m->register_buffer("extra", at::zeros({2}));
    const std::string msg = error_message([&] { tt::load_into_module(path, m); });
    CHECK(msg.find("'.extra'") != std::string::npos);
    CHECK(error_code([&] { tt::load_into_module(path, m); }) == TZ_E_NOT_FOUND);
    CHECK(same(m->named_parameters()["weight"], blank_like(pattern(ST::Float, {2, 3}, 0))));
    tt::LoadOptions o;
    o.strict = false;
    CHECK(tt::load_into_module(path, m, o) == kDemoLayout.size());
  }
  SECTION("shape and dtype must match") {
    struct Wrong : torch::nn::Module {
      Wrong(std::vector<int64_t> shape, ST dtype) {
        register_parameter("weight", at::zeros(shape, at::TensorOptions().dtype(dtype)));
      }
    };
    tt::LoadOptions o;
    o.filter = [](const std::string& name) { return name == ".weight"; };
    Wrong shape({3, 2}, ST::Float);
    CHECK(error_code([&] { tt::load_into_module(path, shape, o); }) == TZ_E_INVALID_ARG);
    CHECK(error_message([&] { tt::load_into_module(path, shape, o); }) ==
          "tensor '.weight' has shape (2, 3) in the file but (3, 2) in the module");
    Wrong dtype({2, 3}, ST::Double);
    CHECK(error_code([&] { tt::load_into_module(path, dtype, o); }) == TZ_E_INVALID_ARG);
    CHECK(at::equal(dtype.named_parameters()["weight"], at::zeros({2, 3}, at::kDouble)));
  }
  SECTION("structured paths name no module tensor") {
    const std::string sp = temp_path("structured.tensors");
    tt::save(sp, {{"", {std::string("layers"), uint64_t(0)}, tt::TensorType::StateDict, 0, at::ones({2})}});
    Demo m(false);
    CHECK(error_code([&] { tt::load_into_module(sp, m); }) == TZ_E_UNSUPPORTED);
    std::remove(sp.c_str());
  }
  std::remove(path.c_str());
}

TEST_CASE("state_dict() keys saved as a state dict load into a module") {
  Demo src(true);
  torch::OrderedDict<std::string, at::Tensor> sd;
  for (const auto& p : src->named_parameters()) sd.insert(p.key(), p.value());
  for (const auto& b : src->named_buffers()) sd.insert(b.key(), b.value());
  REQUIRE(sd.contains("weight"));  // root tensors have no dot
  const std::string path = temp_path("sd.tensors");
  tt::save_state_dict(path, sd);
  for (const auto& r : tt::load(path)) {
    CHECK(r.type == tt::TensorType::StateDict);
    CHECK(r.module_index == 0);
  }
  Demo dst(false);
  CHECK(tt::load_into_module(path, *dst) == sd.size());
  check_same_module(*src, *dst);
  std::remove(path.c_str());
}

TEST_CASE("records keep structured paths, types and module indices") {
  const std::string path = temp_path("records.tensors");
  std::vector<tt::Record> in = {
      {"", {std::string("layers"), uint64_t(0), std::string("w")}, tt::TensorType::StateDict, 0,
       pattern(ST::BFloat16, {2, 2}, 0)},
      {"", {std::string("layers"), uint64_t(1), std::string("w")}, tt::TensorType::StateDict, 0,
       pattern(ST::ComplexHalf, {3}, 1)},
      {"plain.name", {}, tt::TensorType::StateDict, 0, pattern(ST::Long, {}, 2)},
      {"p", {}, tt::TensorType::Param, 7, pattern(ST::Float8_e5m2, {4}, 3)},
      {"b", {}, tt::TensorType::Buffer, 65535, pattern(ST::Bool, {0}, 4)},
  };
  tt::save(path, in);
  const auto out = tt::load(path);
  REQUIRE(out.size() == in.size());
  CHECK(out[0].name == "layers.0.w");
  CHECK(out[1].name == "layers.1.w");
  CHECK(path_is(out[0], in[0].path));
  CHECK(out[2].name == "plain.name");
  CHECK(path_is(out[2], {std::string("plain.name")}));
  CHECK(out[3].type == tt::TensorType::Param);
  CHECK(out[3].module_index == 7);
  CHECK(out[4].type == tt::TensorType::Buffer);
  CHECK(out[4].module_index == 65535);
  for (size_t k = 0; k < in.size(); ++k) CHECK(same(out[k].tensor, in[k].tensor));

  tt::LoadOptions o;
  o.filter = [](const std::string& name) { return name.rfind("layers.", 0) == 0; };
  CHECK(tt::load(path, o).size() == 2);

  SECTION("joined names that collide are a conflict for load_state_dict") {
    const std::string p2 = temp_path("collide.tensors");
    tt::save(p2, {{"a.b", {}, tt::TensorType::StateDict, 0, at::ones({1})},
                  {"", {std::string("a"), std::string("b")}, tt::TensorType::StateDict, 0, at::ones({1})}});
    CHECK(tt::load(p2).size() == 2);
    CHECK(error_code([&] { tt::load_state_dict(p2); }) == TZ_E_CONFLICT);
    std::remove(p2.c_str());
  }
  std::remove(path.c_str());
}

TEST_CASE("views are stored as their values, C-contiguous") {
  const std::string path = temp_path("views.tensors");
  const at::Tensor base = pattern(ST::Float, {2, 3}, 0);
  const at::Tensor c = at::complex(at::arange(4, at::kFloat), at::arange(4, at::kFloat).add(10));
  const at::Tensor bf = pattern(ST::BFloat16, {3, 4}, 1);
  const at::Tensor f8 = pattern(ST::Float8_e4m3fn, {4, 2}, 2);
  tt::save_state_dict(path, std::vector<std::pair<std::string, at::Tensor>>{
                                {"t", base.t()},
                                {"conj", c.conj()},
                                {"neg", at::imag(c.conj())},
                                {"bf", bf.t()},
                                {"f8", f8.t()},
                                {"slice", base.select(1, 1)},
                            });
  const auto sd = tt::load_state_dict(path);
  CHECK(at::equal(sd["t"], base.t().contiguous()));
  CHECK(sd["t"].sizes() == c10::IntArrayRef({3, 2}));
  CHECK(at::equal(sd["conj"], c.conj().resolve_conj()));
  CHECK(at::equal(sd["neg"], at::imag(c.conj()).resolve_neg()));
  CHECK(same(sd["bf"], bf.view(ST::Short).t().contiguous().view(ST::BFloat16)));
  CHECK(same(sd["f8"], f8.view(ST::Char).t().contiguous().view(ST::Float8_e4m3fn)));
  CHECK(at::equal(sd["slice"], base.select(1, 1).contiguous()));
  std::remove(path.c_str());
}

TEST_CASE("meta, empty and scalar tensors") {
  const std::string path = temp_path("meta.tensors");
  const at::Tensor meta = at::empty({3, 4}, at::TensorOptions().dtype(ST::BFloat16).device(c10::kMeta));
  tt::save_state_dict(path, std::vector<std::pair<std::string, at::Tensor>>{
                                {"meta", meta},
                                {"empty", at::empty({0, 4}, at::kHalf)},
                                {"scalar", at::scalar_tensor(2.5, at::kDouble)},
                            });
  const auto sd = tt::load_state_dict(path, tt::LoadOptions{});
  CHECK(sd["meta"].scalar_type() == ST::BFloat16);
  CHECK(sd["meta"].sizes() == c10::IntArrayRef({3, 4}));
  CHECK(at::equal(sd["meta"].view(ST::Short), at::zeros({3, 4}, at::kShort)));  // meta reads as zeros
  CHECK(sd["empty"].sizes() == c10::IntArrayRef({0, 4}));
  CHECK(sd["scalar"].dim() == 0);
  CHECK(sd["scalar"].item<double>() == 2.5);
  std::remove(path.c_str());
}

TEST_CASE("hashes are verified on request") {
  const std::string path = temp_path("hash.tensors");
  tt::save_state_dict(path, std::vector<std::pair<std::string, at::Tensor>>{{"x", pattern(ST::Float, {64}, 0)}});
  auto bytes = slurp(path);
  bytes[bytes.size() - 9] ^= 0x5a;  // the last data byte (an 8-byte end marker follows)
  spit(path, bytes);
  CHECK_NOTHROW(tt::load_state_dict(path));
  tt::LoadOptions o;
  o.verify_hash = true;
  CHECK(error_code([&] { tt::load_state_dict(path, o); }) == TZ_E_HASH);
  try {
    tt::load_state_dict(path, o);
  } catch (const tt::Error& e) {
    CHECK(std::string(e.code_name()) == "TZ_E_HASH");
  }
  std::remove(path.c_str());
}

TEST_CASE("encryption keys pass through to the C ABI") {
  const std::string path = temp_path("enc.tensors");
  const auto sd = dtype_state_dict();
  const tt::Key key = tt::Key::random();
  tt::SaveOptions so;
  so.key = key;
  so.options = {{"crypt_chunk_size", "1024"}};
  tt::save_state_dict(path, sd, so);

  tt::LoadOptions o;
  o.key = tt::Key::from_bytes(key.bytes().data(), TZ_KEY_BYTES);
  o.verify_hash = true;
  const auto loaded = tt::load_state_dict(path, o);
  for (const auto& [name, t] : sd) CHECK(same(loaded[name], t));

  o.key = tt::Key::random();
  CHECK(error_code([&] { tt::load_state_dict(path, o); }) == TZ_E_CRYPTO);
  o.key.reset();
  CHECK(error_code([&] { tt::load_state_dict(path, o); }) != TZ_OK);

  SECTION("password-derived keys") {
    tt::SaveOptions sp;
    sp.key = tt::Key::derive("hunter2", TZ_OPSLIMIT_MIN, TZ_MEMLIMIT_MIN);
    tt::save_state_dict(path, sd, sp);
    tt::LoadOptions lp;
    lp.key = tt::Key::password("hunter2");
    CHECK(same(tt::load_state_dict(path, lp)["bfloat16"], sd[3].second));
    lp.key = tt::Key::password("hunter3");
    CHECK(error_code([&] { tt::load_state_dict(path, lp); }) == TZ_E_CRYPTO);
    CHECK(error_code([] { tt::Key::password("x").bytes(); }) == TZ_E_STATE);
  }
  CHECK(error_code([] { tt::Key::from_bytes("short", 5); }) == TZ_E_INVALID_ARG);
  std::remove(path.c_str());
}

TEST_CASE("errors carry the C codes") {
  CHECK(error_code([] { tt::load_state_dict("/nonexistent/dir/x.tensors"); }) == TZ_E_NOT_FOUND);
  const std::string path = temp_path("errors.tensors");
  using Pairs = std::vector<std::pair<std::string, at::Tensor>>;
  CHECK(error_code([&] { tt::save_state_dict(path, Pairs{{"", at::ones({1})}}); }) == TZ_E_INVALID_ARG);
  CHECK(error_code([&] { tt::save_state_dict(path, Pairs{{"\x1e[1]", at::ones({1})}}); }) == TZ_E_INVALID_ARG);
  CHECK(error_code([&] { tt::save_state_dict(path, Pairs{{"a", at::Tensor()}}); }) == TZ_E_INVALID_ARG);
  CHECK(error_code([&] { tt::save_state_dict(path, Pairs{{"a", at::ones({1})}, {"a", at::ones({1})}}); }) ==
        TZ_E_CONFLICT);
  tt::SaveOptions bad;
  bad.options = {{"no_such_option", "1"}};
  CHECK(error_code([&] { tt::save_state_dict(path, Pairs{{"a", at::ones({1})}}, bad); }) == TZ_E_INVALID_ARG);
  tt::save_state_dict(path, Pairs{{"a", at::ones({1})}});
  tt::LoadOptions lo;
  lo.options = {{"no_such_option", "1"}};
  CHECK(error_code([&] { tt::load_state_dict(path, lo); }) == TZ_E_INVALID_ARG);
  std::remove(path.c_str());
}

TEST_CASE("CUDA loads go through pinned memory, or fail cleanly without CUDA") {
  const std::string path = temp_path("cuda.tensors");
  const auto sd = dtype_state_dict();
  tt::save_state_dict(path, sd);
  tt::LoadOptions o;
  o.device = c10::Device(c10::kCUDA);
  if (!torch::cuda::is_available()) {
    CHECK(error_code([&] { tt::load_state_dict(path, o); }) == TZ_E_UNSUPPORTED);
    WARN("CUDA is not available: only the refusal was tested");
    std::remove(path.c_str());
    return;
  }
  o.staging_bytes = 64;  // several staging batches
  o.verify_hash = true;
  const auto loaded = tt::load_state_dict(path, o);
  for (const auto& [name, t] : sd) {
    INFO(name);
    CHECK(loaded[name].is_cuda());
    CHECK(same(loaded[name], t));
  }
  Demo src(true), dst(false);
  tt::save_module(path, src);
  dst->to(c10::Device(c10::kCUDA));
  CHECK(tt::load_into_module(path, dst) == kDemoLayout.size());
  CHECK(dst->named_parameters()["weight"].is_cuda());
  check_same_module(*src, *dst);
  std::remove(path.c_str());
}

// Driven by tests/test_tz_torch.py with TZ_TORCH_CROSS_DIR set: checks the
// files the Python side wrote (py_*) and writes ours (cpp_*) beside them.
TEST_CASE("cross: files from and for the Python package", "[.cross]") {
  const char* env = std::getenv("TZ_TORCH_CROSS_DIR");
  REQUIRE(env != nullptr);
  const std::string dir = env;
  const auto sd = dtype_state_dict();

  tt::LoadOptions verify;
  verify.verify_hash = true;

  // write_module -> load_into_module, and the same names/indices/types.
  Demo expected(true), loaded(false);
  CHECK(tt::load_into_module(dir + "/py_module.tensors", loaded, verify) == kDemoLayout.size());
  check_same_module(*expected, *loaded);
  check_demo_layout(tt::load(dir + "/py_module.tensors"));
  tt::save_module(dir + "/cpp_module.tensors", expected);

  // write_state_dict with every dtype.
  const auto dtypes = tt::load_state_dict(dir + "/py_dtypes.tensors", verify);
  REQUIRE(dtypes.size() == sd.size());
  for (size_t k = 0; k < sd.size(); ++k) {
    INFO(sd[k].first);
    CHECK(dtypes.keys()[k] == sd[k].first);
    CHECK(same(dtypes[sd[k].first], sd[k].second));
  }
  tt::save_state_dict(dir + "/cpp_dtypes.tensors", sd);

  // Nested state dict: structured paths read and written back unchanged.
  const auto nested = tt::load(dir + "/py_nested.tensors", verify);
  const std::vector<std::string> names = {"layers.0.w", "layers.0.b", "layers.1.w", "layers.1.b", "head.scale",
                                          "plain.name"};
  const std::vector<std::pair<ST, std::vector<int64_t>>> specs = {
      {ST::BFloat16, {2, 2}}, {ST::ComplexHalf, {3}}, {ST::Float8_e5m2, {4}},
      {ST::Float, {2}},       {ST::Float8_e4m3fnuz, {}}, {ST::Long, {2}}};
  REQUIRE(nested.size() == names.size());
  for (size_t k = 0; k < names.size(); ++k) {
    INFO(names[k]);
    CHECK(nested[k].name == names[k]);
    CHECK(nested[k].type == tt::TensorType::StateDict);
    CHECK(same(nested[k].tensor, pattern(specs[k].first, specs[k].second, int(k))));
  }
  CHECK(path_is(nested[0], {std::string("layers"), uint64_t(0), std::string("w")}));
  CHECK(path_is(nested[5], {std::string("plain.name")}));
  tt::save(dir + "/cpp_nested.tensors", nested);

  // Encrypted with the key in key.bin.
  const auto key_bytes = slurp(dir + "/key.bin");
  REQUIRE(key_bytes.size() == TZ_KEY_BYTES);
  tt::LoadOptions dec = verify;
  dec.key = tt::Key::from_bytes(key_bytes.data(), key_bytes.size());
  const auto enc = tt::load_state_dict(dir + "/py_enc.tensors", dec);
  REQUIRE(enc.size() == sd.size());
  for (const auto& [name, t] : sd) CHECK(same(enc[name], t));
  tt::SaveOptions es;
  es.key = dec.key;
  tt::save_state_dict(dir + "/cpp_enc.tensors", sd, es);
}
