#include "checkpoint/safetensors.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fixtures.h"

namespace lair {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr const char* kOrigin = "t.safetensors";

// An 8-byte little-endian header length, the header text and the data.
std::string FileBytes(uint64_t header_len, std::string_view header, std::string_view data) {
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &header_len, 8);
  bytes.append(header);
  bytes.append(data);
  return bytes;
}

// A file whose header is `header` (unpadded) followed by `data_size` zero bytes.
std::string FileWithHeader(std::string_view header, size_t data_size) {
  return FileBytes(header.size(), header, std::string(data_size, '\0'));
}

absl::StatusOr<SafetensorsHeader> Parse(const std::string& bytes) {
  return ParseSafetensorsHeader(bytes, bytes.size(), kOrigin);
}

absl::StatusOr<SafetensorsHeader> ParseHeader(std::string_view header, size_t data_size) {
  return Parse(FileWithHeader(header, data_size));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

Tensor Bf16Tensor(Shape shape, const std::vector<float>& values) {
  Tensor t = Tensor::Zeros(DType::kBF16, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.data<uint16_t>()[i] = FloatToBF16(values[i]);
  return t;
}

Tensor F16Tensor(Shape shape, const std::vector<float>& values) {
  Tensor t = Tensor::Zeros(DType::kF16, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.data<uint16_t>()[i] = FloatToF16(values[i]);
  return t;
}

std::vector<float> Floats(const Tensor& t) {
  return std::vector<float>(t.f32(), t.f32() + t.numel());
}

// ---------------------------------------------------------------------------
// ParseSafetensorsHeader: good input.

TEST(ParseSafetensorsHeaderTest, ParsesTensorsAndMetadata) {
  std::string header =
      R"({"__metadata__": {"format": "pt"},
          "b": {"dtype": "BF16", "shape": [3], "data_offsets": [8, 14]},
          "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "empty": {"dtype": "I64", "shape": [0, 4], "data_offsets": [14, 14]},
          "scalar": {"dtype": "I32", "shape": [], "data_offsets": [14, 18]}}   )";
  auto parsed = ParseHeader(header, 18);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->data_offset, 8 + header.size());
  EXPECT_EQ(parsed->metadata.at("format"), "pt");
  ASSERT_EQ(parsed->tensors.size(), 4u);
  const TensorInfo& b = parsed->tensors.at("b");
  EXPECT_EQ(b.dtype, DType::kBF16);
  EXPECT_EQ(b.shape, (Shape{3}));
  EXPECT_EQ(b.begin, 8u);
  EXPECT_EQ(b.end, 14u);
  EXPECT_EQ(parsed->tensors.at("empty").shape, (Shape{0, 4}));
  EXPECT_EQ(parsed->tensors.at("scalar").shape, Shape{});
}

TEST(ParseSafetensorsHeaderTest, EmptyHeaderIsValid) {
  EXPECT_TRUE(ParseHeader("{}", 0).ok());
  EXPECT_TRUE(ParseHeader("{}      ", 0).ok());
}

TEST(ParseSafetensorsHeaderTest, AcceptsAPrefixOfTheFile) {
  std::string header = R"({"a": {"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}})";
  std::string bytes = FileBytes(header.size(), header, "");
  auto parsed = ParseSafetensorsHeader(bytes, bytes.size() + 4096, kOrigin);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors.at("a").end, 4096u);
}

// ---------------------------------------------------------------------------
// ParseSafetensorsHeader: every kind of malformed input.

struct BadHeaderCase {
  const char* label;
  std::string bytes;  // the whole file
  absl::StatusCode code;
  std::vector<std::string> substrings;  // each must be in the message, beside the origin
};

std::string Entry(absl::string_view dtype, absl::string_view shape, absl::string_view offsets) {
  return absl::StrCat(R"({"dtype": )", dtype, R"(, "shape": )", shape, R"(, "data_offsets": )",
                      offsets, "}");
}

std::vector<BadHeaderCase> BadHeaderCases() {
  using C = absl::StatusCode;
  const std::string f32x2 = Entry(R"("F32")", "[2]", "[0, 8]");
  std::vector<BadHeaderCase> cases = {
      {"empty file", "", C::kDataLoss, {"too short"}},
      {"short file", "abc", C::kDataLoss, {"3 bytes", "too short"}},
      {"header length past the end",
       FileBytes(1000, "{}", ""),
       C::kDataLoss,
       {"header length 1000", "runs past the end"}},
      {"absurd header length",
       FileBytes(uint64_t{1} << 62, "{}", ""),
       C::kInvalidArgument,
       {"limit"}},
      {"not JSON", FileWithHeader(R"({"a": )", 0), C::kInvalidArgument, {"not valid JSON"}},
      {"binary garbage",
       FileWithHeader("{\xff\xfe\x00", 0),
       C::kInvalidArgument,
       {"not valid JSON"}},
      {"not an object",
       FileWithHeader("[1, 2]", 0),
       C::kInvalidArgument,
       {"does not start with '{'"}},
      {"entry not an object",
       FileWithHeader(R"({"w": 5})", 0),
       C::kInvalidArgument,
       {"tensor 'w'", "must be an object"}},
      {"entry missing data_offsets",
       FileWithHeader(R"({"w": {"dtype": "F32", "shape": [1]}})", 4),
       C::kInvalidArgument,
       {"tensor 'w'", "missing 'data_offsets'"}},
      {"unknown dtype",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F64")", "[1]", "[0, 8]"), "}"), 8),
       C::kInvalidArgument,
       {"tensor 'w'", "unsupported dtype", "F64"}},
      {"dtype not a string",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry("7", "[1]", "[0, 4]"), "}"), 4),
       C::kInvalidArgument,
       {"tensor 'w'", "'dtype' must be a string"}},
      {"negative dimension",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F32")", "[2, -1]", "[0, 8]"), "}"), 8),
       C::kInvalidArgument,
       {"tensor 'w'", "negative dimension"}},
      {"fractional dimension",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F32")", "[2.5]", "[0, 8]"), "}"), 8),
       C::kInvalidArgument,
       {"tensor 'w'", "non-negative integers"}},
      {"shape not an array",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F32")", "2", "[0, 8]"), "}"), 8),
       C::kInvalidArgument,
       {"tensor 'w'", "'shape' must be an array"}},
      {"element count overflows",
       FileWithHeader(
           absl::StrCat(R"({"w": )", Entry(R"("F32")", "[4294967296, 4294967296]", "[0, 8]"), "}"),
           8),
       C::kInvalidArgument,
       {"tensor 'w'", "too many elements"}},
      {"dimension past int64",
       FileWithHeader(
           absl::StrCat(R"({"w": )", Entry(R"("F32")", "[18446744073709551615]", "[0, 8]"), "}"),
           8),
       C::kInvalidArgument,
       {"tensor 'w'", "too many elements"}},
      {"byte count overflows",
       FileWithHeader(
           absl::StrCat(R"({"w": )", Entry(R"("F32")", "[4611686018427387904]", "[0, 8]"), "}"), 8),
       C::kInvalidArgument,
       {"tensor 'w'", "too many bytes"}},
      {"one offset",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F32")", "[2]", "[8]"), "}"), 8),
       C::kInvalidArgument,
       {"tensor 'w'", "'data_offsets' must be [begin, end]"}},
      {"three offsets",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F32")", "[2]", "[0, 4, 8]"), "}"), 8),
       C::kInvalidArgument,
       {"tensor 'w'", "'data_offsets' must be [begin, end]"}},
      {"string offset",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F32")", "[2]", R"([0, "8"])"), "}"), 8),
       C::kInvalidArgument,
       {"tensor 'w'", "'data_offsets' must be [begin, end]"}},
      {"fractional offset",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F32")", "[2]", "[0, 8.0]"), "}"), 8),
       C::kInvalidArgument,
       {"tensor 'w'", "'data_offsets' must be [begin, end]"}},
      {"negative offset",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F32")", "[2]", "[-8, 0]"), "}"), 8),
       C::kInvalidArgument,
       {"tensor 'w'", "'data_offsets' must be [begin, end]"}},
      {"offsets an object",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F32")", "[2]", R"({"a": 1})"), "}"), 8),
       C::kInvalidArgument,
       {"tensor 'w'", "'data_offsets' must be [begin, end]"}},
      {"begin after end",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F32")", "[0]", "[8, 4]"), "}"), 8),
       C::kInvalidArgument,
       {"tensor 'w'", "[8, 4]", "end before they begin"}},
      {"end past the data",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F32")", "[4]", "[0, 16]"), "}"), 8),
       C::kDataLoss,
       {"tensor 'w'", "run past the end", "8-byte data section"}},
      {"byte count mismatch",
       FileWithHeader(absl::StrCat(R"({"w": )", Entry(R"("F32")", "[2]", "[0, 12]"), "}"), 12),
       C::kInvalidArgument,
       {"tensor 'w'", "F32[2] needs 8 bytes", "hold 12"}},
      {"overlap",
       FileWithHeader(
           absl::StrCat(R"({"a": )", f32x2, R"(, "b": )", Entry(R"("F32")", "[2]", "[4, 12]"), "}"),
           12),
       C::kInvalidArgument,
       {"'a' and 'b' overlap"}},
      {"gap between tensors",
       FileWithHeader(absl::StrCat(R"({"a": )", Entry(R"("F32")", "[1]", "[0, 4]"), R"(, "b": )",
                                   Entry(R"("F32")", "[1]", "[8, 12]"), "}"),
                      12),
       C::kInvalidArgument,
       {"gap of 4 bytes before tensor 'b'"}},
      {"gap at the start",
       FileWithHeader(absl::StrCat(R"({"a": )", Entry(R"("F32")", "[1]", "[4, 8]"), "}"), 8),
       C::kInvalidArgument,
       {"gap of 4 bytes before tensor 'a'"}},
      {"bytes after the last tensor",
       FileWithHeader(absl::StrCat(R"({"a": )", f32x2, "}"), 12),
       C::kInvalidArgument,
       {"4 bytes at the end belong to no tensor"}},
      {"duplicate tensor name",
       FileWithHeader(absl::StrCat(R"({"a": )", f32x2, R"(, "a": )", f32x2, "}"), 8),
       C::kInvalidArgument,
       {"duplicate tensor name 'a'"}},
      {"duplicate key in an entry",
       FileWithHeader(
           R"({"a": {"dtype": "F32", "dtype": "F16", "shape": [2], "data_offsets": [0, 8]}})", 8),
       C::kInvalidArgument,
       {"tensor 'a'", "duplicate key 'dtype'"}},
      {"metadata not strings",
       FileWithHeader(R"({"__metadata__": {"step": 3}})", 0),
       C::kInvalidArgument,
       {"__metadata__", "'step'"}},
      {"metadata not an object",
       FileWithHeader(R"({"__metadata__": [1]})", 0),
       C::kInvalidArgument,
       {"__metadata__"}},
  };
  return cases;
}

TEST(ParseSafetensorsHeaderTest, RejectsMalformedInput) {
  for (const BadHeaderCase& c : BadHeaderCases()) {
    SCOPED_TRACE(c.label);
    auto parsed = Parse(c.bytes);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), c.code) << parsed.status();
    EXPECT_THAT(parsed.status().message(), HasSubstr(kOrigin));
    for (const std::string& s : c.substrings) {
      EXPECT_THAT(parsed.status().message(), HasSubstr(s));
    }
  }
}

TEST(ParseSafetensorsHeaderTest, PrefixTooShortForTheHeader) {
  std::string header = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  std::string bytes = FileBytes(header.size(), header, "");
  auto parsed =
      ParseSafetensorsHeader(std::string_view(bytes).substr(0, 20), bytes.size() + 4, kOrigin);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("do not hold"));
}

// ---------------------------------------------------------------------------
// Files: writing, reading, and what goes wrong on disk.

class SafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("lair_ckpt_", info->test_suite_name(), "_", info->name(), "_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(std::string_view name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(SafetensorsFileTest, WriteThenReadRoundTrips) {
  Tensor w = Tensor::FromFloats({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Bf16Tensor({3}, {0.5f, -1.0f, 2.0f});
  Tensor ids = Tensor::Zeros(DType::kI64, {4});
  for (int i = 0; i < 4; ++i) ids.data<int64_t>()[i] = int64_t{1} << (10 * i);
  Tensor empty = Tensor::Zeros(DType::kF16, {0, 8});
  const std::string path = Path("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", w}, {"b", b}, {"ids", ids}, {"empty", empty}},
                               {{"format", "pt"}})
                  .ok());

  std::string bytes = ReadFile(path);
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u) << "header must be padded to a multiple of 8";
  EXPECT_EQ(bytes.size(), 8 + header_len + 24 + 6 + 32);

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), path);
  EXPECT_EQ((*file)->header().metadata.at("format"), "pt");
  EXPECT_TRUE((*file)->Contains("w"));
  EXPECT_FALSE((*file)->Contains("v"));
  // Data is laid out in the given order.
  EXPECT_EQ((*file)->header().tensors.at("w").begin, 0u);
  EXPECT_EQ((*file)->header().tensors.at("b").begin, 24u);

  auto got_w = (*file)->Get("w");
  ASSERT_TRUE(got_w.ok());
  EXPECT_EQ(got_w->dtype(), DType::kF32);
  EXPECT_EQ(got_w->shape(), (Shape{2, 3}));
  EXPECT_THAT(Floats(*got_w), ElementsAre(1, 2, 3, 4, 5, 6));
  auto got_b = (*file)->Get("b");
  ASSERT_TRUE(got_b.ok());
  EXPECT_EQ(got_b->dtype(), DType::kBF16);
  EXPECT_THAT(Floats(got_b->ToF32()), ElementsAre(0.5f, -1.0f, 2.0f));
  auto got_ids = (*file)->Get("ids");
  ASSERT_TRUE(got_ids.ok());
  EXPECT_EQ(got_ids->data<int64_t>()[3], int64_t{1} << 30);
  auto got_empty = (*file)->Get("empty");
  ASSERT_TRUE(got_empty.ok());
  EXPECT_EQ(got_empty->shape(), (Shape{0, 8}));
  EXPECT_EQ(got_empty->dtype(), DType::kF16);

  auto missing = (*file)->Get("v");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), AllOf(HasSubstr(path), HasSubstr("'v'")));
}

TEST_F(SafetensorsFileTest, TensorsAliasTheMappingAndKeepItAlive) {
  const std::string path = Path("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", Tensor::FromFloats({2}, {7, 8})}}).ok());
  Tensor w;
  {
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok());
    auto got = (*file)->Get("w");
    ASSERT_TRUE(got.ok());
    w = *got;
    auto again = (*file)->Get("w");
    EXPECT_EQ(again->raw(), w.raw()) << "Get() should alias the mapping, not copy";
  }
  // The file handle is gone; the tensor still owns the mapping.
  EXPECT_THAT(Floats(w), ElementsAre(7, 8));
}

TEST_F(SafetensorsFileTest, MisalignedDataIsCopied) {
  // A 5-byte header puts the data at offset 13: misaligned for F32.
  std::string header = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  float values[2] = {1.5f, -2.5f};
  std::string bytes =
      FileBytes(header.size(), header, std::string_view(reinterpret_cast<char*>(values), 8));
  ASSERT_NE((8 + header.size()) % 4, 0u);
  WriteFile(Path("odd.safetensors"), bytes);
  auto file = SafetensorsFile::Open(Path("odd.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  auto a = (*file)->Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->raw()) % 4, 0u);
  EXPECT_THAT(Floats(*a), ElementsAre(1.5f, -2.5f));
}

TEST_F(SafetensorsFileTest, WriteRejectsBadTensorLists) {
  Tensor t = Tensor::FromFloats({1}, {1});
  absl::Status dup = WriteSafetensors(Path("d.safetensors"), {{"a", t}, {"a", t}});
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.message(), HasSubstr("duplicate tensor name 'a'"));
  absl::Status reserved = WriteSafetensors(Path("r.safetensors"), {{"__metadata__", t}});
  EXPECT_EQ(reserved.code(), absl::StatusCode::kInvalidArgument);
  absl::Status undefined = WriteSafetensors(Path("u.safetensors"), {{"a", Tensor()}});
  EXPECT_EQ(undefined.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(undefined.message(), HasSubstr("'a'"));
  EXPECT_FALSE(fs::exists(Path("d.safetensors")));
  absl::Status no_dir = WriteSafetensors(Path("no/such/dir/x.safetensors"), {{"a", t}});
  EXPECT_EQ(no_dir.code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsFileTest, WritesAnEmptyFile) {
  ASSERT_TRUE(WriteSafetensors(Path("e.safetensors"), {}).ok());
  auto file = SafetensorsFile::Open(Path("e.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->header().tensors.empty());
}

TEST_F(SafetensorsFileTest, OpenReportsMissingTruncatedAndOddFiles) {
  auto missing = SafetensorsFile::Open(Path("missing.safetensors"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(Path("missing.safetensors")));

  WriteFile(Path("empty.safetensors"), "");
  auto empty = SafetensorsFile::Open(Path("empty.safetensors"));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(empty.status().message(), HasSubstr(Path("empty.safetensors")));

  const std::string full = Path("full.safetensors");
  ASSERT_TRUE(WriteSafetensors(full, {{"w", Tensor::Zeros(DType::kF32, {64})}}).ok());
  std::string bytes = ReadFile(full);
  WriteFile(Path("cut.safetensors"), std::string_view(bytes).substr(0, bytes.size() - 10));
  auto cut = SafetensorsFile::Open(Path("cut.safetensors"));
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cut.status().message(),
              AllOf(HasSubstr(Path("cut.safetensors")), HasSubstr("tensor 'w'")));
  WriteFile(Path("cut_header.safetensors"), std::string_view(bytes).substr(0, 20));
  auto cut_header = SafetensorsFile::Open(Path("cut_header.safetensors"));
  EXPECT_EQ(cut_header.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cut_header.status().message(), HasSubstr("runs past the end"));

  auto dir = SafetensorsFile::Open(dir_.string());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dir.status().message(), HasSubstr("not a regular file"));
}

// ---------------------------------------------------------------------------
// Checkpoint directories.

using CheckpointTest = SafetensorsFileTest;

TEST_F(CheckpointTest, OpensASingleFile) {
  ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"),
                               {{"z.weight", Tensor::FromFloats({2, 2}, {1, 2, 3, 4})},
                                {"a.weight", Bf16Tensor({2}, {0.25f, 8.0f})},
                                {"h.weight", F16Tensor({2}, {-0.5f, 3.0f})},
                                {"ids", Tensor::Zeros(DType::kI32, {2})}})
                  .ok());
  auto ckpt = Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->dir(), dir_.string());
  EXPECT_THAT(ckpt->Names(), ElementsAre("a.weight", "h.weight", "ids", "z.weight"));
  EXPECT_TRUE(ckpt->Contains("ids"));
  EXPECT_FALSE(ckpt->Contains("nope"));

  auto z = ckpt->GetF32("z.weight", {2, 2});
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_THAT(Floats(*z), ElementsAre(1, 2, 3, 4));
  auto a = ckpt->GetF32("a.weight", {2});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype(), DType::kF32);
  EXPECT_THAT(Floats(*a), ElementsAre(0.25f, 8.0f));
  auto h = ckpt->GetF32("h.weight", {2});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(Floats(*h), ElementsAre(-0.5f, 3.0f));

  auto missing = ckpt->Get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), AllOf(HasSubstr("'nope'"), HasSubstr(dir_.string())));
  auto wrong_shape = ckpt->GetF32("z.weight", {4});
  EXPECT_EQ(wrong_shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_shape.status().message(),
              AllOf(HasSubstr("'z.weight'"), HasSubstr("[4]"), HasSubstr("[2, 2]")));
  auto ints = ckpt->GetF32("ids", {2});
  EXPECT_EQ(ints.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ints.status().message(), AllOf(HasSubstr("'ids'"), HasSubstr("I32")));
}

TEST_F(CheckpointTest, EmptyDirectoryIsNotFound) {
  auto ckpt = Checkpoint::Open(dir_.string());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ckpt.status().message(),
              AllOf(HasSubstr(dir_.string()), HasSubstr("model.safetensors")));
}

TEST_F(CheckpointTest, CorruptSingleFileNamesIt) {
  WriteFile(Path("model.safetensors"), FileWithHeader("{oops", 0));
  auto ckpt = Checkpoint::Open(dir_.string());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ckpt.status().message(), HasSubstr(Path("model.safetensors")));
}

class ShardedCheckpointTest : public SafetensorsFileTest {
 protected:
  void SetUp() override {
    SafetensorsFileTest::SetUp();
    ASSERT_TRUE(WriteSafetensors(Path("model-00001-of-00002.safetensors"),
                                 {{"embed.weight", Tensor::FromFloats({2}, {1, 2})},
                                  {"layers.0.weight", Tensor::FromFloats({1}, {3})}})
                    .ok());
    ASSERT_TRUE(WriteSafetensors(Path("model-00002-of-00002.safetensors"),
                                 {{"layers.1.weight", Bf16Tensor({1}, {4})},
                                  {"lm_head.weight", Tensor::FromFloats({1}, {5})}})
                    .ok());
  }

  void WriteIndex(absl::string_view weight_map) {
    WriteFile(Path("model.safetensors.index.json"),
              absl::StrCat(R"({"metadata": {"total_size": 20}, "weight_map": )", weight_map, "}"));
  }

  static constexpr const char* kShard1 = R"("model-00001-of-00002.safetensors")";
  static constexpr const char* kShard2 = R"("model-00002-of-00002.safetensors")";
};

TEST_F(ShardedCheckpointTest, OpensEveryShard) {
  WriteIndex(absl::StrCat(R"({"embed.weight": )", kShard1, R"(, "layers.0.weight": )", kShard1,
                          R"(, "layers.1.weight": )", kShard2, R"(, "lm_head.weight": )", kShard2,
                          "}"));
  auto ckpt = Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT(ckpt->Names(),
              ElementsAre("embed.weight", "layers.0.weight", "layers.1.weight", "lm_head.weight"));
  auto embed = ckpt->GetF32("embed.weight", {2});
  ASSERT_TRUE(embed.ok());
  EXPECT_THAT(Floats(*embed), ElementsAre(1, 2));
  auto layer1 = ckpt->GetF32("layers.1.weight", {1});
  ASSERT_TRUE(layer1.ok());
  EXPECT_THAT(Floats(*layer1), ElementsAre(4));
  auto head = ckpt->GetF32("lm_head.weight", {1});
  ASSERT_TRUE(head.ok());
  EXPECT_THAT(Floats(*head), ElementsAre(5));
}

TEST_F(ShardedCheckpointTest, MissingShardNamesTheIndex) {
  WriteIndex(R"({"embed.weight": "model-00003-of-00002.safetensors"})");
  auto ckpt = Checkpoint::Open(dir_.string());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ckpt.status().message(),
              AllOf(HasSubstr(Path("model.safetensors.index.json")),
                    HasSubstr("model-00003-of-00002.safetensors"), HasSubstr("'embed.weight'")));
}

TEST_F(ShardedCheckpointTest, TensorAbsentFromItsShardNamesTheIndex) {
  WriteIndex(absl::StrCat(R"({"embed.weight": )", kShard2, "}"));
  auto ckpt = Checkpoint::Open(dir_.string());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(ckpt.status().message(),
              AllOf(HasSubstr(Path("model.safetensors.index.json")), HasSubstr("'embed.weight'"),
                    HasSubstr("model-00002-of-00002.safetensors")));
}

TEST_F(ShardedCheckpointTest, ShardOutsideTheDirectoryIsRejected) {
  WriteIndex(R"({"embed.weight": "../model-00001-of-00002.safetensors"})");
  auto ckpt = Checkpoint::Open(dir_.string());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ckpt.status().message(), HasSubstr("model.safetensors.index.json"));
}

TEST_F(ShardedCheckpointTest, MalformedIndexNamesIt) {
  for (std::string_view text : {"{not json", R"({"metadata": {}})", R"({"weight_map": []})",
                                R"({"weight_map": {"embed.weight": 3}})"}) {
    SCOPED_TRACE(text);
    WriteFile(Path("model.safetensors.index.json"), text);
    auto ckpt = Checkpoint::Open(dir_.string());
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ckpt.status().message(), HasSubstr(Path("model.safetensors.index.json")));
  }
}

// ---------------------------------------------------------------------------
// The real fixtures, written by fla / transformers.

TEST(CheckpointFixtureTest, GlaTinyF32) {
  LAIR_FIXTURE_OR_SKIP(path, "models/gla-tiny/model.safetensors");
  auto ckpt = Checkpoint::Open(fs::path(path).parent_path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->Names().size(), 31u);
  auto head = ckpt->Get("lm_head.weight");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->dtype(), DType::kF32);
  EXPECT_EQ(head->shape(), (Shape{512, 128}));
  auto gk = ckpt->GetF32("model.layers.0.attn.gk_proj.0.weight", {16, 128});
  EXPECT_TRUE(gk.ok()) << gk.status();
  auto bias = ckpt->GetF32("model.layers.1.attn.gk_proj.1.bias", {64});
  EXPECT_TRUE(bias.ok()) << bias.status();
  auto norm = ckpt->GetF32("model.norm.weight", {128});
  ASSERT_TRUE(norm.ok());
  EXPECT_FLOAT_EQ(norm->f32()[0], 0.9815019369125366f);
}

TEST(CheckpointFixtureTest, GlaTinyBf16) {
  LAIR_FIXTURE_OR_SKIP(path, "models/gla-tiny-bf16/model.safetensors");
  auto ckpt = Checkpoint::Open(fs::path(path).parent_path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->Names().size(), 31u);
  auto embed = ckpt->Get("model.embeddings.weight");
  ASSERT_TRUE(embed.ok());
  EXPECT_EQ(embed->dtype(), DType::kBF16);
  EXPECT_EQ(embed->shape(), (Shape{512, 128}));
  auto norm = ckpt->GetF32("model.norm.weight", {128});
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_EQ(norm->dtype(), DType::kF32);
  EXPECT_THAT(std::vector<float>(norm->f32(), norm->f32() + 4),
              ElementsAre(0.87890625f, 0.99609375f, 0.9765625f, 1.0f));
  auto wrong = ckpt->GetF32("model.layers.0.attn.q_proj.weight", {128, 64});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("model.layers.0.attn.q_proj.weight"));
}

TEST(CheckpointFixtureTest, GoldenFileHoldsIntegerPrompts) {
  LAIR_FIXTURE_OR_SKIP(path, "models/gla-tiny/golden.safetensors");
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto prompt = (*file)->Get("prompt_a");
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(prompt->dtype(), DType::kI64);
  EXPECT_EQ(prompt->shape(), (Shape{100}));
  EXPECT_EQ((*file)->header().tensors.at("logits_a").shape, (Shape{100, 512}));
}

}  // namespace
}  // namespace lair
