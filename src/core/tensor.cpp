#include "core/tensor.h"

#include <cstring>
#include <utility>

namespace deepinfer {
namespace {

bool is_fp4(DType dtype) {
  return dtype == DType::kF4E2M1x2;
}

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) DI_THROW(what, " overflows int64 (", a, " * ", b, ")");
  return result;
}

int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t result = 0;
  if (__builtin_add_overflow(a, b, &result)) DI_THROW(what, " overflows int64 (", a, " + ", b, ")");
  return result;
}

// Bytes from the first element to one past the last addressed byte.
int64_t extent_bytes(DType dtype, const Shape& shape, const Strides& strides) {
  int64_t last = 0;  // element offset of the last element
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return 0;
    last =
        checked_add(last, checked_mul(shape[d] - 1, strides[d], "tensor extent"), "tensor extent");
  }
  if (is_fp4(dtype)) return last / 2 + 1;
  return checked_mul(last + 1, dtype_bits(dtype) / 8, "tensor extent");
}

}  // namespace

// ---- Dims ------------------------------------------------------------------------------

Dims::Dims(std::span<const int64_t> values) {
  if (values.size() > static_cast<size_t>(kMaxRank)) {
    DI_THROW("tensor rank ", values.size(), " exceeds the maximum rank ", kMaxRank);
  }
  for (int64_t value : values) values_[rank_++] = value;
}

void Dims::push_back(int64_t value) {
  if (rank_ == kMaxRank) DI_THROW("tensor rank would exceed the maximum rank ", kMaxRank);
  values_[rank_++] = value;
}

void Dims::erase(int index) {
  DI_CHECK(index >= 0 && index < rank_);
  for (int i = index; i + 1 < rank_; ++i) values_[i] = values_[i + 1];
  values_[--rank_] = 0;
}

void Dims::insert(int index, int64_t value) {
  DI_CHECK(index >= 0 && index <= rank_);
  if (rank_ == kMaxRank) DI_THROW("tensor rank would exceed the maximum rank ", kMaxRank);
  for (int i = rank_; i > index; --i) values_[i] = values_[i - 1];
  values_[index] = value;
  ++rank_;
}

int64_t Dims::product() const {
  int64_t result = 1;
  for (int i = 0; i < rank_; ++i) result = checked_mul(result, values_[i], "element count");
  return result;
}

std::string Dims::to_string() const {
  std::string text = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(values_[i]);
  }
  return text + "]";
}

bool operator==(const Dims& a, const Dims& b) {
  if (a.rank_ != b.rank_) return false;
  for (int i = 0; i < a.rank_; ++i) {
    if (a.values_[i] != b.values_[i]) return false;
  }
  return true;
}

// ---- TensorView --------------------------------------------------------------------------

TensorView::TensorView() : shape_{0}, strides_{1} {}

TensorView::TensorView(void* storage, size_t storage_bytes, int64_t byte_offset, DType dtype,
                       Shape shape, Strides strides, Device device)
    : storage_(storage),
      storage_bytes_(storage_bytes),
      byte_offset_(byte_offset),
      dtype_(dtype),
      device_(device),
      shape_(shape),
      strides_(strides) {
  if (shape_.size() != strides_.size()) {
    DI_THROW("tensor view: shape ", shape_.to_string(), " and strides ", strides_.to_string(),
             " have different ranks");
  }
  for (int d = 0; d < shape_.size(); ++d) {
    if (shape_[d] < 0) DI_THROW("tensor view: negative size in shape ", shape_.to_string());
    if (strides_[d] < 0) {
      DI_THROW("tensor view: negative stride in ", strides_.to_string(), " (not supported)");
    }
  }
  if (byte_offset_ < 0) DI_THROW("tensor view: negative byte offset ", byte_offset_);
  if (is_fp4(dtype_)) {
    if (shape_.empty()) DI_THROW("packed fp4 tensor view needs rank >= 1 (two values per byte)");
    if (shape_.back() % 2 != 0) {
      DI_THROW("packed fp4 tensor view: last dimension ", shape_.back(), " of shape ",
               shape_.to_string(), " must be even (two values per byte)");
    }
    if (strides_.back() != 1 && shape_.back() > 0) {
      DI_THROW("packed fp4 tensor view: last-dimension stride must be 1, got strides ",
               strides_.to_string());
    }
    for (int d = 0; d + 1 < shape_.size(); ++d) {
      if (strides_[d] % 2 != 0 && shape_[d] > 1) {
        DI_THROW("packed fp4 tensor view: stride ", strides_[d], " of dimension ", d,
                 " is odd, so rows would start mid-byte (strides ", strides_.to_string(), ")");
      }
    }
  }
  const int64_t extent = extent_bytes(dtype_, shape_, strides_);
  if (extent > 0 && (storage_ == nullptr || checked_add(byte_offset_, extent, "tensor view end") >
                                                static_cast<int64_t>(storage_bytes_))) {
    DI_THROW("tensor view ", to_string(), " needs bytes [", byte_offset_, ", ",
             byte_offset_ + extent, ") but its storage holds ", storage_bytes_, " bytes");
  }
}

TensorView TensorView::contiguous(void* data, DType dtype, Shape shape, Device device) {
  const size_t bytes = dtype_storage_bytes(dtype, shape.product());
  return TensorView(data, bytes, 0, dtype, shape, contiguous_strides(shape), device);
}

Strides TensorView::contiguous_strides(const Shape& shape) {
  Strides strides = shape;
  int64_t stride = 1;
  for (int d = shape.size() - 1; d >= 0; --d) {
    strides[d] = stride;
    stride = checked_mul(stride, shape[d] > 0 ? shape[d] : 1, "contiguous stride");
  }
  return strides;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = rank() - 1; d >= 0; --d) {
    if (shape_[d] == 0) return true;
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

int TensorView::normalize_dim(int dim, int rank) const {
  const int normalized = dim < 0 ? dim + rank : dim;
  if (normalized < 0 || normalized >= rank) {
    DI_THROW("dimension ", dim, " is out of range for tensor ", to_string(), " of rank ", rank);
  }
  return normalized;
}

void TensorView::check_dtype(DType requested) const {
  if (requested != dtype_) {
    DI_THROW("tensor ", to_string(), " holds ", dtype_name(dtype_), " but was accessed as ",
             dtype_name(requested));
  }
}

int64_t TensorView::element_offset(std::span<const int64_t> index) const {
  if (static_cast<int>(index.size()) != rank()) {
    DI_THROW("tensor ", to_string(), " indexed with ", index.size(), " indices, needs ", rank());
  }
  int64_t offset = 0;
  for (int d = 0; d < rank(); ++d) {
    if (index[d] < 0 || index[d] >= shape_[d]) {
      DI_THROW("index ", index[d], " out of range for dimension ", d, " of tensor ", to_string());
    }
    offset += index[d] * strides_[d];
  }
  return offset;
}

void* TensorView::element_address(std::span<const int64_t> index) const {
  if (!device_.is_cpu()) {
    DI_THROW("element access to tensor ", to_string(), " which is not in host memory");
  }
  if (is_fp4(dtype_)) DI_THROW("element access by reference is impossible for packed fp4");
  const int64_t offset = element_offset(index);
  return static_cast<std::byte*>(raw_data()) + offset * (dtype_bits(dtype_) / 8);
}

TensorView TensorView::with_layout(int64_t byte_offset, Shape shape, Strides strides) const {
  return TensorView(storage_, storage_bytes_, byte_offset, dtype_, shape, strides, device_);
}

TensorView TensorView::narrow(int dim, int64_t start, int64_t length) const {
  const int d = normalize_dim(dim);
  if (start < 0 || length < 0 || start > shape_[d] || length > shape_[d] - start) {
    DI_THROW("narrow(dim ", dim, ", start ", start, ", length ", length,
             ") is out of range for tensor ", to_string());
  }
  const int64_t element_shift = start * strides_[d];
  int64_t byte_shift = 0;
  if (is_fp4(dtype_)) {
    if (d == rank() - 1 && (start % 2 != 0 || length % 2 != 0)) {
      DI_THROW("narrow of the packed fp4 last dimension needs an even start and length, got start ",
               start, " length ", length, " on tensor ", to_string());
    }
    byte_shift = element_shift / 2;
  } else {
    byte_shift = element_shift * (dtype_bits(dtype_) / 8);
  }
  Shape shape = shape_;
  shape[d] = length;
  return with_layout(length == 0 ? byte_offset_ : byte_offset_ + byte_shift, shape, strides_);
}

TensorView TensorView::select(int dim, int64_t index) const {
  const int d = normalize_dim(dim);
  if (is_fp4(dtype_) && d == rank() - 1) {
    DI_THROW("select on the packed fp4 last dimension would split a byte (tensor ", to_string(),
             ")");
  }
  if (index < 0 || index >= shape_[d]) {
    DI_THROW("select(dim ", dim, ", index ", index, ") is out of range for tensor ", to_string());
  }
  TensorView narrowed = narrow(d, index, 1);
  Shape shape = narrowed.shape_;
  Strides strides = narrowed.strides_;
  shape.erase(d);
  strides.erase(d);
  return with_layout(narrowed.byte_offset_, shape, strides);
}

TensorView TensorView::view(Shape new_shape) const {
  // Resolve a single -1.
  int inferred = -1;
  int64_t known = 1;
  for (int d = 0; d < new_shape.size(); ++d) {
    if (new_shape[d] == -1) {
      if (inferred >= 0) DI_THROW("view shape ", new_shape.to_string(), " has more than one -1");
      inferred = d;
    } else if (new_shape[d] < 0) {
      DI_THROW("view shape ", new_shape.to_string(), " has a negative size");
    } else {
      known = checked_mul(known, new_shape[d], "view element count");
    }
  }
  const int64_t count = numel();
  if (inferred >= 0) {
    if (known == 0 || count % known != 0) {
      DI_THROW("cannot view tensor ", to_string(), " (", count, " elements) as shape ",
               new_shape.to_string());
    }
    new_shape[inferred] = count / known;
  }
  if (new_shape.product() != count) {
    DI_THROW("cannot view tensor ", to_string(), " (", count, " elements) as shape ",
             new_shape.to_string(), " (", new_shape.product(), " elements)");
  }
  if (count == 0 || rank() == 0) {
    return with_layout(byte_offset_, new_shape, contiguous_strides(new_shape));
  }

  // Walk both shapes from the innermost dimension. The old dimensions split into chunks that
  // are contiguous with respect to each other; each chunk must map onto a run of new
  // dimensions with the same element count, which then get row-major strides within the chunk.
  Strides new_strides = new_shape;
  int new_dim = new_shape.size() - 1;
  int64_t chunk_base_stride = strides_.back();
  int64_t old_chunk_count = 1;
  int64_t new_chunk_count = 1;
  for (int old_dim = rank() - 1; old_dim >= 0; --old_dim) {
    old_chunk_count *= shape_[old_dim];
    const bool chunk_ends =
        old_dim == 0 ||
        (shape_[old_dim - 1] != 1 && strides_[old_dim - 1] != old_chunk_count * chunk_base_stride);
    if (!chunk_ends) continue;
    while (new_dim >= 0 && (new_chunk_count < old_chunk_count || new_shape[new_dim] == 1)) {
      new_strides[new_dim] = new_chunk_count * chunk_base_stride;
      new_chunk_count *= new_shape[new_dim];
      --new_dim;
    }
    if (new_chunk_count != old_chunk_count) {
      DI_THROW("cannot view tensor ", to_string(), " as shape ", new_shape.to_string(),
               " without a copy: its strides do not allow it (make it contiguous first)");
    }
    if (old_dim > 0) {
      chunk_base_stride = strides_[old_dim - 1];
      old_chunk_count = 1;
      new_chunk_count = 1;
    }
  }
  DI_CHECK(new_dim == -1, "view stride computation left dimensions unassigned");
  return with_layout(byte_offset_, new_shape, new_strides);
}

TensorView TensorView::transpose(int dim0, int dim1) const {
  int order[kMaxRank];
  for (int d = 0; d < rank(); ++d) order[d] = d;
  std::swap(order[normalize_dim(dim0)], order[normalize_dim(dim1)]);
  return permute(std::span<const int>(order, static_cast<size_t>(rank())));
}

TensorView TensorView::permute(std::initializer_list<int> order) const {
  return permute(std::span<const int>(order));
}

TensorView TensorView::permute(std::span<const int> order) const {
  if (static_cast<int>(order.size()) != rank()) {
    DI_THROW("permute of tensor ", to_string(), " needs ", rank(), " dimensions, got ",
             order.size());
  }
  bool seen[kMaxRank] = {};
  Shape shape = shape_;
  Strides strides = strides_;
  for (int i = 0; i < rank(); ++i) {
    const int d = normalize_dim(order[i]);
    if (seen[d]) DI_THROW("permute of tensor ", to_string(), " repeats dimension ", order[i]);
    seen[d] = true;
    shape[i] = shape_[d];
    strides[i] = strides_[d];
  }
  if (is_fp4(dtype_) && normalize_dim(order[rank() - 1]) != rank() - 1) {
    DI_THROW("permute/transpose would move the packed fp4 last dimension of tensor ", to_string());
  }
  return with_layout(byte_offset_, shape, strides);
}

TensorView TensorView::unsqueeze(int dim) const {
  const int d = normalize_dim(dim, rank() + 1);
  Shape shape = shape_;
  Strides strides = strides_;
  const int64_t stride = d < rank() ? strides_[d] * shape_[d] : 1;
  shape.insert(d, 1);
  strides.insert(d, stride);
  return with_layout(byte_offset_, shape, strides);
}

TensorView TensorView::reinterpret(DType dtype) const {
  const int from_bits = dtype_bits(dtype_);
  const int to_bits = dtype_bits(dtype);
  if (from_bits == to_bits) {
    return TensorView(storage_, storage_bytes_, byte_offset_, dtype, shape_, strides_, device_);
  }
  const bool unpacking = from_bits == 8 && to_bits == 4;
  const bool packing = from_bits == 4 && to_bits == 8;
  if (!unpacking && !packing) {
    DI_THROW("cannot reinterpret tensor ", to_string(), " as ", dtype_name(dtype),
             ": element widths differ");
  }
  if (rank() == 0 || (strides_.back() != 1 && shape_.back() > 1)) {
    DI_THROW(
        "reinterpret between bytes and packed fp4 needs a last dimension with stride 1 (tensor ",
        to_string(), ")");
  }
  Shape shape = shape_;
  Strides strides = strides_;
  for (int d = 0; d < rank(); ++d) {
    if (d == rank() - 1) {
      shape[d] = unpacking ? shape_[d] * 2 : shape_[d] / 2;
      strides[d] = 1;
    } else {
      strides[d] = unpacking ? strides_[d] * 2 : strides_[d] / 2;
    }
  }
  return TensorView(storage_, storage_bytes_, byte_offset_, dtype, shape, strides, device_);
}

std::string TensorView::to_string() const {
  return concat(dtype_name(dtype_), shape_.to_string(), " strides ", strides_.to_string(), " +",
                byte_offset_, "B ", device_.to_string());
}

TensorView arena_tensor(Arena& arena, DType dtype, Shape shape) {
  for (int64_t size : shape) {
    if (size < 0) DI_THROW("cannot create a tensor of shape ", shape.to_string());
  }
  const size_t bytes = dtype_storage_bytes(dtype, shape.product());
  void* data = arena.allocate(bytes);
  return TensorView(data, bytes, 0, dtype, shape, TensorView::contiguous_strides(shape),
                    arena.device());
}

// ---- Tensor ------------------------------------------------------------------------------

Tensor Tensor::empty(DType dtype, Shape shape, Allocator& allocator, size_t alignment) {
  for (int64_t size : shape) {
    if (size < 0) DI_THROW("cannot create a tensor of shape ", shape.to_string());
  }
  const size_t bytes = dtype_storage_bytes(dtype, shape.product());
  Tensor tensor;
  tensor.buffer_ = Buffer(allocator, bytes, alignment);
  tensor.view_ = TensorView(tensor.buffer_.data(), bytes, 0, dtype, shape,
                            TensorView::contiguous_strides(shape), allocator.device());
  return tensor;
}

Tensor Tensor::zeros(DType dtype, Shape shape, Allocator& allocator) {
  if (!allocator.device().is_cpu()) {
    DI_THROW("Tensor::zeros fills on the host; allocator is on ", allocator.device().to_string());
  }
  Tensor tensor = empty(dtype, shape, allocator);
  if (tensor.buffer_.size() > 0) std::memset(tensor.buffer_.data(), 0, tensor.buffer_.size());
  return tensor;
}

Tensor::Tensor(Tensor&& other) noexcept
    : buffer_(std::move(other.buffer_)), view_(std::exchange(other.view_, TensorView())) {}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    buffer_ = std::move(other.buffer_);
    view_ = std::exchange(other.view_, TensorView());
  }
  return *this;
}

}  // namespace deepinfer
