#include <catch2/catch.hpp>

#include "tz/format/error.hpp"
#include "tz/format/tensor_path.hpp"

using namespace tz::format;
using namespace std::string_literals;

namespace {
tz::Errc decode_error(const std::string& s) {
  try {
    decode_path(s);
  } catch (const tz::Error& e) {
    return e.code();
  }
  return tz::Errc::internal;
}
}  // namespace

TEST_CASE("plain names decode to one string") {
  const auto p = decode_path("layer.0.weight");
  REQUIRE(p.size() == 1);
  CHECK(p[0].str == "layer.0.weight");
  CHECK(decode_path("na\xc3\xafve")[0].str == "na\xc3\xafve");
  CHECK(decode_error("\xff\xfe") == tz::Errc::format);
  CHECK(decode_error("") == tz::Errc::format);
}

TEST_CASE("json-seq names match upstream's encoding") {
  TensorPath p{PathComponent::key("model"), PathComponent::key("layer"), PathComponent::idx(0),
               PathComponent::key("weight")};
  CHECK(encode_path(p) == "\x1e[\"model\",\"layer\",0,\"weight\"]");
  CHECK(encode_path({PathComponent::idx(0)}) == "\x1e[0]");
  // FORMAT.md §4.3: non-ASCII as \u escapes, astral planes as surrogate pairs.
  TensorPath u{PathComponent::key("uni\xc3\xa9"), PathComponent::key("k\xf0\x9f\x98\x80")};
  CHECK(encode_path(u) == "\x1e[\"uni\\u00e9\",\"k\\ud83d\\ude00\"]");
  TensorPath esc{PathComponent::key("a"), PathComponent::key("q\"\\/\n\t\x01\x7f")};
  CHECK(encode_path(esc) == "\x1e[\"a\",\"q\\\"\\\\/\\n\\t\\u0001\\u007f\"]");
  CHECK(decode_path(encode_path(u)) == u);
  CHECK(decode_path(encode_path(esc)) == esc);
  CHECK(decode_path(encode_path(p)) == p);
}

TEST_CASE("json-seq decoding accepts any valid JSON") {
  const auto p = decode_path("\x1e[ \"a\\/b\" , 12 ,\"\\u00E9\", \"\xc3\xa9\"]");
  REQUIRE(p.size() == 4);
  CHECK(p[0].str == "a/b");
  CHECK(p[1].index == 12);
  CHECK(p[2].str == "\xc3\xa9");
  CHECK(p[3].str == "\xc3\xa9");
  // Upstream's Python accepts booleans as ints.
  CHECK(decode_path("\x1e[true]")[0].index == 1);
  CHECK(decode_path("\x1e[\"a\"]") == TensorPath{PathComponent::key("a")});
}

TEST_CASE("json-seq edge cases are rejected") {
  for (const char* bad : {"\x1e[]", "\x1e[1.5]", "\x1e[-1]", "\x1e[null]", "\x1e [\"a\"]", "\x1e[\"a\n\"]",
                          "\x1e[[1]]", "\x1e[{}]", "\x1e[\"a\"", "\x1e", "\x1e[1,]", "\x1e[01]",
                          "\x1e[\"\\ud800\"]", "\x1e[\"\\x\"]", "\x1e[1e5]", "\x1e[99999999999999999999999]",
                          "\x1e[\"a\"]x]"}) {
    INFO(bad);
    CHECK(decode_error(bad) == tz::Errc::format);
  }
}

TEST_CASE("the writer refuses names that would read back differently") {
  CHECK_THROWS_AS(encode_path({PathComponent::key("")}), tz::Error);
  CHECK_THROWS_AS(encode_path({PathComponent::key("\x1e[1]")}), tz::Error);
}

TEST_CASE("path trie detects conflicts") {
  PathTrie t;
  t.insert({PathComponent::key("a"), PathComponent::key("b")});
  t.insert({PathComponent::key("a"), PathComponent::key("c")});
  CHECK_THROWS_AS(t.insert({PathComponent::key("a")}), tz::Error);                                 // prefix
  CHECK_THROWS_AS(t.insert({PathComponent::key("a"), PathComponent::key("b")}), tz::Error);        // duplicate
  CHECK_THROWS_AS(t.insert({PathComponent::key("a"), PathComponent::key("b"), PathComponent::idx(0)}), tz::Error);
  CHECK_THROWS_AS(t.insert({PathComponent::key("a"), PathComponent::idx(0)}), tz::Error);          // mixed
  CHECK(t.contains({PathComponent::key("a"), PathComponent::key("b")}));
  t.erase({PathComponent::key("a"), PathComponent::key("b")});
  t.erase({PathComponent::key("a"), PathComponent::key("c")});
  t.insert({PathComponent::key("a")});  // free again once erased
  CHECK(t.contains({PathComponent::key("a")}));
}

TEST_CASE("a path trie of any depth is built and freed without recursion") {
  // Issue 15 (fixed before our fuzz runs; a crafted input replays it from
  // fuzz/regressions/tensor_path/): a structured name of tens of thousands of
  // components made freeing the trie recurse once per level and overflow
  // the stack. 200,000 levels need far more than a default stack.
  TensorPath deep(200000, PathComponent::idx(0));
  {
    PathTrie trie;
    trie.insert(deep);
    CHECK(trie.contains(deep));
    PathTrie moved(std::move(trie));
    moved = PathTrie();  // the move-assigned-over trie is freed the same way
  }
  // The longest a file can hold, through the decoder.
  std::string name = "\x1e[";
  while (name.size() < 65530) name += "0,";
  name += "0]";
  const TensorPath p = decode_path(name);
  CHECK(p.size() > 32000);
  PathTrie trie;
  trie.insert(p);
  trie.erase(p);
  trie.insert(p);
}
