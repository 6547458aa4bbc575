#include "io/safetensors.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "core/error.h"
#include "io/mapped_file.h"
#include "io/strict_json.h"

namespace deepinfer {

struct SafetensorsFile::State {
  std::string source;
  MappedFile mapping;  // empty when the caller owns the image
  std::span<const std::byte> image;
  uint64_t header_bytes = 0;
  uint64_t data_bytes = 0;
  std::vector<SafetensorsTensor> tensors;  // data order
  std::vector<size_t> by_name;             // indices into tensors, sorted by name
  SafetensorsMetadata metadata;
};

namespace {

using Json = nlohmann::json;

constexpr std::string_view kSupportedDTypes =
    "F32, BF16, F16, F8_E4M3, F8_E5M2, F8_E8M0, F4, I8, I32, I64, BOOL";

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

uint64_t read_le64(const std::byte* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint64_t>(bytes[i]);
  return value;
}

// Validation of one header; every message starts with the file (and tensor) it is about.
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& source) : source_(source) {}

  [[noreturn]] void fail_file(const std::string& problem) const {
    DI_THROW("safetensors file '", source_, "': ", problem);
  }
  [[noreturn]] void fail_tensor(std::string_view tensor, const std::string& problem) const {
    DI_THROW("safetensors file '", source_, "': tensor '", tensor, "': ", problem);
  }

  Json parse_json(std::string_view text) const {
    // nlohmann's lexer takes a NUL byte for the end of input and would accept "{}\0garbage";
    // a NUL is never valid JSON text (inside strings it must be escaped).
    if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
      fail_file(concat("header is not valid JSON: NUL byte at header offset ", nul));
    }
    Json header;
    DuplicateKey duplicate;
    bool unique = false;
    try {
      unique = parse_json_without_duplicates(text, header, duplicate);
    } catch (const Json::exception& error) {
      fail_file(concat("header is not valid JSON: ", error.what()));
    }
    if (!unique) {
      if (duplicate.depth == 1) fail_tensor(duplicate.key, "appears more than once in the header");
      fail_file(concat("header repeats the key '", duplicate.key, "' inside one object"));
    }
    return header;
  }

  SafetensorsMetadata parse_metadata(const Json& value) const {
    if (!value.is_object()) {
      fail_file(concat("__metadata__ must be an object of strings, found ", value.type_name()));
    }
    SafetensorsMetadata metadata;
    for (const auto& [key, entry] : value.items()) {
      if (!entry.is_string()) {
        fail_file(
            concat("__metadata__ entry '", key, "' must be a string, found ", entry.type_name()));
      }
      metadata.emplace(key, entry.get<std::string>());
    }
    return metadata;
  }

  const Json& field(std::string_view tensor, const Json& entry, const char* name) const {
    auto it = entry.find(name);
    if (it == entry.end()) fail_tensor(tensor, concat("missing field '", name, "'"));
    return *it;
  }

  uint64_t non_negative_integer(std::string_view tensor, const Json& value,
                                const char* what) const {
    if (value.is_number_unsigned()) return value.get<uint64_t>();
    if (value.is_number_integer()) {
      fail_tensor(tensor, concat(what, " is negative (", value.get<int64_t>(), ")"));
    }
    fail_tensor(tensor, concat(what, " must be a non-negative integer, found ", value.dump()));
  }

  // Reads one tensor entry; the byte span is attached by the caller once offsets are checked.
  SafetensorsTensor parse_tensor(const std::string& name, const Json& entry,
                                 uint64_t data_bytes) const {
    if (!entry.is_object())
      fail_tensor(name, concat("entry must be an object, found ", entry.type_name()));
    SafetensorsTensor tensor;
    tensor.name = name;

    const Json& dtype = field(name, entry, "dtype");
    if (!dtype.is_string())
      fail_tensor(name, concat("field 'dtype' must be a string, found ", dtype.type_name()));
    auto parsed_dtype = dtype_from_safetensors_name(dtype.get<std::string>());
    if (!parsed_dtype) {
      fail_tensor(name,
                  concat("unknown dtype ", dtype.dump(), " (supported: ", kSupportedDTypes, ")"));
    }
    tensor.dtype = *parsed_dtype;

    const Json& shape = field(name, entry, "shape");
    if (!shape.is_array())
      fail_tensor(name, concat("field 'shape' must be an array, found ", shape.type_name()));
    uint64_t element_count = 1;
    bool overflow = false;
    for (const Json& dim : shape) {
      const uint64_t extent = non_negative_integer(name, dim, "a shape dimension");
      overflow = overflow || extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
                 __builtin_mul_overflow(element_count, extent, &element_count);
      tensor.shape.push_back(static_cast<int64_t>(extent));
    }
    if (overflow || element_count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail_tensor(name, concat("shape ", shape.dump(), " has more elements than fit in 63 bits"));
    }

    const Json& offsets = field(name, entry, "data_offsets");
    if (!offsets.is_array() || offsets.size() != 2) {
      fail_tensor(name, concat("field 'data_offsets' must be an array [begin, end], found ",
                               offsets.dump()));
    }
    const uint64_t begin = non_negative_integer(name, offsets[0], "data_offsets[0]");
    const uint64_t end = non_negative_integer(name, offsets[1], "data_offsets[1]");
    if (end < begin)
      fail_tensor(name, concat("data_offsets [", begin, ", ", end, "] end before they begin"));

    const int bits = dtype_bits(tensor.dtype);
    if (bits == 4 && element_count % 2 != 0) {
      fail_tensor(
          name, concat("dtype F4 packs two values per byte but shape ", shape_string(tensor.shape),
                       " has an odd element count ", element_count));
    }
    uint64_t expected_bytes = 0;
    if (bits == 4) {
      expected_bytes = element_count / 2;
    } else if (__builtin_mul_overflow(element_count, static_cast<uint64_t>(bits / 8),
                                      &expected_bytes)) {
      fail_tensor(name, concat("shape ", shape_string(tensor.shape), " of dtype ",
                               dtype.get<std::string>(), " needs more bytes than fit in 64 bits"));
    }
    if (end - begin != expected_bytes) {
      fail_tensor(name, concat("data_offsets [", begin, ", ", end, "] span ", end - begin,
                               " bytes but dtype ", dtype.get<std::string>(), " with shape ",
                               shape_string(tensor.shape), " needs ", expected_bytes, " bytes"));
    }
    if (end > data_bytes) {
      fail_tensor(name, concat("data_offsets [", begin, ", ", end,
                               "] run past the end of the data section (", data_bytes,
                               " bytes): the file is truncated or the offsets are corrupt"));
    }
    tensor.data_offset = begin;
    return tensor;
  }

 private:
  const std::string& source_;
};

uint64_t storage_bytes(const SafetensorsTensor& tensor) {
  return dtype_storage_bytes(tensor.dtype, tensor.element_count());
}

}  // namespace

int64_t SafetensorsTensor::element_count() const {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

TensorView SafetensorsTensor::view() const {
  if (shape.size() > static_cast<size_t>(kMaxRank)) {
    DI_THROW("safetensors file '", file, "': tensor '", name, "': rank ", shape.size(),
             " exceeds the largest supported rank ", kMaxRank);
  }
  const size_t element_bytes = std::max(1, dtype_bits(dtype) / 8);
  if (reinterpret_cast<uintptr_t>(bytes.data()) % element_bytes != 0) {
    DI_THROW("safetensors file '", file, "': tensor '", name, "': data is not aligned to its ",
             element_bytes,
             "-byte elements (the header length is not a multiple of 8); rewrite the file");
  }
  // TensorView has no const flavour; the pages are PROT_READ, so a stray write faults instead
  // of silently changing a checkpoint shared with other processes.
  return TensorView::contiguous(const_cast<std::byte*>(bytes.data()), dtype,
                                Shape(std::span<const int64_t>(shape)));
}

SafetensorsTensor reinterpret_as_packed_fp4(const SafetensorsTensor& tensor) {
  if (tensor.dtype == DType::kF4E2M1x2) return tensor;
  if (tensor.dtype != DType::kI8) {
    DI_THROW("safetensors file '", tensor.file, "': tensor '", tensor.name,
             "': only I8 tensors hold packed fp4 (two e2m1 per byte), this one is ",
             dtype_safetensors_name(tensor.dtype));
  }
  if (tensor.shape.empty()) {
    DI_THROW("safetensors file '", tensor.file, "': tensor '", tensor.name,
             "': a scalar cannot hold packed fp4 pairs; expected shape [..., in/2]");
  }
  SafetensorsTensor packed = tensor;
  packed.dtype = DType::kF4E2M1x2;
  // Cannot overflow: a nonzero last extent is at most the element count, which equals the byte
  // count of a mapped tensor and is therefore far below 2^62.
  packed.shape.back() *= 2;
  return packed;
}

std::shared_ptr<const SafetensorsFile::State> SafetensorsFile::parse_image(
    std::shared_ptr<State> state) {
  HeaderParser parser(state->source);
  const std::span<const std::byte> image = state->image;
  if (image.size() < 8) {
    parser.fail_file(
        concat("is ", image.size(), " bytes long, too short for the 8-byte header length"));
  }
  const uint64_t header_bytes = read_le64(image.data());
  if (header_bytes > kSafetensorsMaxHeaderBytes) {
    parser.fail_file(concat("header length ", header_bytes, " exceeds the limit of ",
                            kSafetensorsMaxHeaderBytes,
                            " bytes (corrupt, or not a safetensors file)"));
  }
  if (header_bytes > image.size() - 8) {
    parser.fail_file(concat("header length ", header_bytes, " runs past the end of the file (",
                            image.size(),
                            " bytes): the file is truncated or not a safetensors file"));
  }
  state->header_bytes = header_bytes;
  state->data_bytes = image.size() - 8 - header_bytes;

  const std::string_view text(reinterpret_cast<const char*>(image.data() + 8), header_bytes);
  const Json header = parser.parse_json(text);
  if (!header.is_object())
    parser.fail_file(concat("header must be a JSON object, found ", header.type_name()));

  state->tensors.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      state->metadata = parser.parse_metadata(entry);
      continue;
    }
    state->tensors.push_back(parser.parse_tensor(name, entry, state->data_bytes));
  }

  // The format requires the tensors to tile the data section exactly: no overlaps (two tensors
  // aliasing bytes) and no holes (bytes no tensor describes), as the reference library checks.
  std::sort(state->tensors.begin(), state->tensors.end(), [](const auto& a, const auto& b) {
    if (a.data_offset != b.data_offset) return a.data_offset < b.data_offset;
    if (storage_bytes(a) != storage_bytes(b)) return storage_bytes(a) < storage_bytes(b);
    return a.name < b.name;
  });
  const std::byte* data = image.data() + 8 + header_bytes;
  uint64_t covered = 0;
  const SafetensorsTensor* previous = nullptr;
  for (SafetensorsTensor& tensor : state->tensors) {
    const uint64_t size = storage_bytes(tensor);
    if (tensor.data_offset < covered) {
      parser.fail_tensor(
          tensor.name, concat("data_offsets [", tensor.data_offset, ", ", tensor.data_offset + size,
                              "] overlap tensor '", previous->name, "', which ends at ", covered));
    }
    if (tensor.data_offset > covered) {
      parser.fail_tensor(
          tensor.name,
          concat("data_offsets [", tensor.data_offset, ", ", tensor.data_offset + size,
                 "] leave a gap of ", tensor.data_offset - covered, " unused bytes after ",
                 previous ? concat("tensor '", previous->name, "'")
                          : std::string("the start of the data section"),
                 " (safetensors requires tensors to be contiguous)"));
    }
    tensor.bytes = {data + tensor.data_offset, static_cast<size_t>(size)};
    tensor.file = state->source;
    covered = tensor.data_offset + size;
    previous = &tensor;
  }
  if (covered != state->data_bytes) {
    parser.fail_file(concat(
        state->data_bytes - covered, " trailing bytes after ",
        previous ? concat("the last tensor '", previous->name, "'") : std::string("the header"),
        " are not described by the header (safetensors forbids unused bytes)"));
  }

  state->by_name.resize(state->tensors.size());
  for (size_t i = 0; i < state->by_name.size(); ++i) state->by_name[i] = i;
  std::sort(state->by_name.begin(), state->by_name.end(),
            [&](size_t a, size_t b) { return state->tensors[a].name < state->tensors[b].name; });
  return state;
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  auto state = std::make_shared<State>();
  state->source = path.string();
  state->mapping = MappedFile::open(path);
  state->image = state->mapping.bytes();
  return SafetensorsFile(parse_image(std::move(state)));
}

SafetensorsFile SafetensorsFile::parse(std::span<const std::byte> image, std::string source) {
  auto state = std::make_shared<State>();
  state->source = std::move(source);
  state->image = image;
  return SafetensorsFile(parse_image(std::move(state)));
}

const std::string& SafetensorsFile::source() const {
  return state_->source;
}
std::span<const SafetensorsTensor> SafetensorsFile::tensors() const {
  return state_->tensors;
}
const SafetensorsMetadata& SafetensorsFile::metadata() const {
  return state_->metadata;
}
uint64_t SafetensorsFile::header_bytes() const {
  return state_->header_bytes;
}
uint64_t SafetensorsFile::data_bytes() const {
  return state_->data_bytes;
}
std::span<const std::byte> SafetensorsFile::image() const {
  return state_->image;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto& tensors = state_->tensors;
  auto it = std::lower_bound(
      state_->by_name.begin(), state_->by_name.end(), name,
      [&](size_t index, std::string_view key) { return tensors[index].name < key; });
  if (it == state_->by_name.end() || tensors[*it].name != name) return nullptr;
  return &tensors[*it];
}

const SafetensorsTensor& SafetensorsFile::at(std::string_view name) const {
  const SafetensorsTensor* tensor = find(name);
  if (tensor == nullptr)
    DI_THROW("safetensors file '", state_->source, "' has no tensor '", name, "'");
  return *tensor;
}

}  // namespace deepinfer
