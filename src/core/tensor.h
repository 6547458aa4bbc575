// Tensor views: a typed, strided window onto bytes someone else owns, and Tensor, the owning
// pair of a Buffer and a contiguous view of it.
//
// Conventions:
//  - shape and strides are int64 and count *logical elements*; the byte offset counts bytes.
//  - Views never copy. Operations that cannot be expressed by new strides (view() of a
//    non-viewable layout, narrowing packed fp4 mid-byte) throw Error instead of copying.
//  - Packed fp4 (DType::kF4E2M1x2): shape counts fp4 values, two per byte (element 2k in the
//    low nibble of byte k). The last dimension must be even and have stride 1, and every other
//    stride must be even, so each row starts on a byte and rows are packed. Narrowing the last
//    dimension needs an even start and length; select/transpose/permute of the last dimension
//    are refused. Bytes of a contiguous fp4 view = numel / 2.
//  - Strides may be 0 (a broadcast view) but never negative.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/memory.h"

namespace deepinfer {

inline constexpr int kMaxRank = 8;

// A short list of int64 (sizes or strides) stored inline: views never touch the heap.
class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<int64_t> values) : Dims(std::span<const int64_t>(values)) {}
  explicit Dims(std::span<const int64_t> values);

  int size() const { return rank_; }
  bool empty() const { return rank_ == 0; }
  int64_t operator[](int i) const { return values_[i]; }
  int64_t& operator[](int i) { return values_[i]; }
  const int64_t* begin() const { return values_; }
  const int64_t* end() const { return values_ + rank_; }
  int64_t back() const { return values_[rank_ - 1]; }
  void push_back(int64_t value);
  void erase(int index);
  void insert(int index, int64_t value);
  // Product of the entries (1 for an empty list); throws on int64 overflow.
  int64_t product() const;
  std::span<const int64_t> span() const { return {values_, static_cast<size_t>(rank_)}; }
  // "[2, 3, 4]"
  std::string to_string() const;

  friend bool operator==(const Dims& a, const Dims& b);

 private:
  int64_t values_[kMaxRank] = {};
  int rank_ = 0;
};

using Shape = Dims;
using Strides = Dims;

class TensorView {
 public:
  // An empty view: f32, shape [0], no storage.
  TensorView();
  // The general form. `storage` points at an allocation of `storage_bytes` bytes; the view
  // starts `byte_offset` bytes into it. Throws Error unless every addressed byte lies inside
  // the allocation, strides are non-negative and the fp4 rules above hold.
  TensorView(void* storage, size_t storage_bytes, int64_t byte_offset, DType dtype, Shape shape,
             Strides strides, Device device = Device::cpu());
  // A row-major contiguous view of exactly the bytes the shape needs, starting at `data`.
  static TensorView contiguous(void* data, DType dtype, Shape shape, Device device = Device::cpu());
  // Row-major strides for `shape` (in elements).
  static Strides contiguous_strides(const Shape& shape);

  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int rank() const { return shape_.size(); }
  // Size / stride of one dimension; negative `dim` counts from the end (-1 = last).
  int64_t size(int dim) const { return shape_[normalize_dim(dim)]; }
  int64_t stride(int dim) const { return strides_[normalize_dim(dim)]; }
  int64_t numel() const { return shape_.product(); }
  // Bytes numel elements occupy when packed (numel / 2 for fp4).
  size_t nbytes() const { return dtype_storage_bytes(dtype_, numel()); }
  // Row-major dense: strides equal contiguous_strides(), ignoring dimensions of size 1.
  bool is_contiguous() const;

  void* storage() const { return storage_; }
  size_t storage_bytes() const { return storage_bytes_; }
  int64_t byte_offset() const { return byte_offset_; }
  // Address of the first element (for fp4, of the byte holding it).
  void* raw_data() const { return static_cast<std::byte*>(storage_) + byte_offset_; }
  // Typed address of the first element; throws Error when T does not match dtype().
  template <typename T>
  T* data() const {
    check_dtype(DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }
  // Element access for tests and slow paths: bounds-checked, host memory only, not for fp4.
  template <typename T, typename... Index>
  T& at(Index... index) const {
    check_dtype(DTypeOf<T>::value);
    const int64_t indices[] = {static_cast<int64_t>(index)..., 0};
    return *static_cast<T*>(element_address(std::span<const int64_t>(indices, sizeof...(Index))));
  }
  // Offset of an element from the first element, in elements (for fp4: in fp4 values).
  int64_t element_offset(std::span<const int64_t> index) const;

  // Elements [start, start + length) of `dim`.
  TensorView narrow(int dim, int64_t start, int64_t length) const;
  // The slice at `index` of `dim`, with `dim` removed.
  TensorView select(int dim, int64_t index) const;
  // The same elements in a new shape, without copying; one entry may be -1 (inferred).
  // Throws Error when the strides cannot express the new shape (make it contiguous first).
  TensorView view(Shape new_shape) const;
  TensorView transpose(int dim0, int dim1) const;
  // Dimension i of the result is dimension order[i] of this view.
  TensorView permute(std::initializer_list<int> order) const;
  TensorView permute(std::span<const int> order) const;
  TensorView unsqueeze(int dim) const;
  // The same view with another dtype of the same element width (e.g. I8 bytes holding packed
  // fp4 -> kF4E2M1x2 doubles the last dimension; the reverse halves it).
  TensorView reinterpret(DType dtype) const;

  // "bf16[4, 8] strides [8, 1] +0B cpu"
  std::string to_string() const;

 private:
  int normalize_dim(int dim) const { return normalize_dim(dim, rank()); }
  int normalize_dim(int dim, int rank) const;
  void check_dtype(DType requested) const;
  void* element_address(std::span<const int64_t> index) const;
  TensorView with_layout(int64_t byte_offset, Shape shape, Strides strides) const;

  void* storage_ = nullptr;
  size_t storage_bytes_ = 0;
  int64_t byte_offset_ = 0;
  DType dtype_ = DType::kF32;
  Device device_ = Device::cpu();
  Shape shape_;
  Strides strides_;
};

// A contiguous tensor carved out of a per-step arena: valid until the arena's next reset().
TensorView arena_tensor(Arena& arena, DType dtype, Shape shape);

// An owning tensor: a Buffer from an allocator plus a contiguous view of it. Move-only; views
// taken from it are valid while it lives.
class Tensor {
 public:
  Tensor() = default;
  // Uninitialised contents.
  static Tensor empty(DType dtype, Shape shape, Allocator& allocator = host_allocator(),
                      size_t alignment = kDefaultAlignment);
  // Zero-filled (all-zero bits); host allocators only.
  static Tensor zeros(DType dtype, Shape shape, Allocator& allocator = host_allocator());

  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: a Tensor is usable as a view

  DType dtype() const { return view_.dtype(); }
  const Shape& shape() const { return view_.shape(); }
  int64_t numel() const { return view_.numel(); }
  Device device() const { return view_.device(); }
  template <typename T>
  T* data() const {
    return view_.data<T>();
  }
  template <typename T, typename... Index>
  T& at(Index... index) const {
    return view_.at<T>(index...);
  }

 private:
  Buffer buffer_;
  TensorView view_;
};

}  // namespace deepinfer
