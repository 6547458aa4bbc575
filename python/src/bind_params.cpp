// SamplingParams and EngineArgs. SamplingParams goes through the C++ JSON form
// (sampling_params_from_json_value): the one parser that knows every field, accepts vLLM's
// shapes (stop as a string or list, so_args.schema as a dict) and names the bad field; a field
// added there appears here without a change. EngineArgs has no JSON form: each field is
// registered once below, which gives both the attribute and the keyword.
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "core/error.h"
#include "deepinfer/engine_args.h"
#include "deepinfer/sampling_params.h"
#include "sampling/sampling_params_json.h"

namespace deepinfer::python {

using namespace nb::literals;

using nlohmann::json;

namespace {

std::string python_type_name(nb::handle value) {
  return nb::cast<std::string>(nb::type_name(value.type()));
}

}  // namespace

json to_json(nb::handle value, const std::string& path) {
  if (value.is_none()) return nullptr;
  if (PyBool_Check(value.ptr())) return value.ptr() == Py_True;
  if (PyLong_Check(value.ptr()) || (!PyFloat_Check(value.ptr()) && PyIndex_Check(value.ptr()))) {
    nb::object index = nb::steal(PyNumber_Index(value.ptr()));
    if (!index.is_valid()) throw nb::python_error();
    int overflow = 0;
    const long long signed_value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    // Non-negative integers are unsigned JSON numbers, as the JSON parser makes them (seq_seed
    // accepts only those).
    if (overflow == 0 && signed_value >= 0) return static_cast<uint64_t>(signed_value);
    if (overflow == 0) return static_cast<int64_t>(signed_value);
    if (overflow > 0) {
      const unsigned long long unsigned_value = PyLong_AsUnsignedLongLong(index.ptr());
      if (!PyErr_Occurred()) return static_cast<uint64_t>(unsigned_value);
      PyErr_Clear();
    }
    DI_THROW(path, ": the integer ", nb::cast<std::string>(nb::str(value)),
             " does not fit in 64 bits");
  }
  if (PyFloat_Check(value.ptr())) return PyFloat_AsDouble(value.ptr());
  if (nb::isinstance<nb::str>(value)) return nb::cast<std::string>(value);
  if (nb::isinstance<nb::list>(value) || nb::isinstance<nb::tuple>(value)) {
    json array = json::array();
    size_t i = 0;
    for (nb::handle item : value) {
      array.push_back(to_json(item, concat(path, "[", i++, "]")));
    }
    return array;
  }
  if (nb::isinstance<nb::dict>(value)) {
    json object = json::object();
    for (auto [key, item] : nb::borrow<nb::dict>(value)) {
      if (!nb::isinstance<nb::str>(key)) {
        DI_THROW(path, ": dict keys must be str, got ", python_type_name(key));
      }
      const auto name = nb::cast<std::string>(key);
      object[name] = to_json(item, concat(path, ".", name));
    }
    return object;
  }
  DI_THROW(path, " must be None, bool, int, float, str, list or dict, got ",
           python_type_name(value));
}

nb::object from_json(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return nb::none();
    case json::value_t::boolean:
      return nb::bool_(value.get<bool>());
    case json::value_t::number_integer:
      return nb::int_(value.get<int64_t>());
    case json::value_t::number_unsigned:
      return nb::steal(PyLong_FromUnsignedLongLong(value.get<uint64_t>()));
    case json::value_t::number_float:
      return nb::float_(value.get<double>());
    case json::value_t::string:
      return nb::str(value.get_ref<const std::string&>().c_str(),
                     value.get_ref<const std::string&>().size());
    case json::value_t::array: {
      nb::list list;
      for (const auto& item : value) list.append(from_json(item));
      return list;
    }
    case json::value_t::object: {
      nb::dict dict;
      for (const auto& [key, item] : value.items()) dict[key.c_str()] = from_json(item);
      return dict;
    }
    default:
      DI_THROW("a ", value.type_name(), " JSON value has no Python form");
  }
}

namespace {

// vLLM spells the per-request seed `seed`; the C++ field is seq_seed.
std::string canonical_sampling_key(std::string key) {
  return key == "seed" ? "seq_seed" : key;
}

json sampling_params_json(const SamplingParams& params) {
  return json::parse(sampling_params_to_json(params));
}

SamplingParams sampling_params_from_kwargs(const nb::kwargs& kwargs) {
  json object = json::object();
  for (auto [key, value] : kwargs) {
    const auto name = canonical_sampling_key(nb::cast<std::string>(key));
    if (object.contains(name)) {
      DI_THROW("invalid sampling params: seed and seq_seed name the same field; give one");
    }
    object[name] = to_json(value, name);
  }
  return sampling_params_from_json_value(object);
}

std::string sampling_params_repr(const SamplingParams& params) {
  std::string text = "SamplingParams(";
  bool first = true;
  const json fields = sampling_params_json(params);
  for (const auto& [key, value] : fields.items()) {
    text += concat(first ? "" : ", ", key, "=", nb::cast<std::string>(nb::repr(from_json(value))));
    first = false;
  }
  return text + ")";
}

void bind_sampling_params(nb::module_& module) {
  nb::class_<SamplingParams> cls(
      module, "SamplingParams",
      "Per-request sampling parameters (vLLM names; include/deepinfer/sampling_params.h says "
      "what each field means).\n\n"
      "SamplingParams(temperature=0.7, top_p=0.95, max_tokens=64, seed=1,\n"
      "               stop=['\\n\\n'], logprobs=5,\n"
      "               so_args={'schema_type': 'json', 'schema': {...}})\n\n"
      "Every keyword is optional; `seed` is vLLM's name for seq_seed. Unknown keywords, wrong "
      "types and invalid values raise deepinfer.Error (a ValueError) naming the field, at "
      "construction and on assignment.");
  cls.def(
      "__init__",
      [](SamplingParams* self, const nb::kwargs& kwargs) {
        new (self) SamplingParams(sampling_params_from_kwargs(kwargs));
      },
      "Keyword arguments only: the field names of SamplingParams.");
  // One property per field of the JSON form; assignment re-validates the whole object.
  static const std::vector<std::string> field_names = [] {
    std::vector<std::string> names;
    const json defaults = sampling_params_json(SamplingParams{});
    for (const auto& [key, value] : defaults.items()) {
      names.push_back(key);
    }
    return names;
  }();
  for (const std::string& name : field_names) {
    cls.def_prop_rw(
        name.c_str(),
        [name](const SamplingParams& params) {
          return from_json(sampling_params_json(params).at(name));
        },
        [name](SamplingParams& params, nb::handle value) {
          json object = sampling_params_json(params);
          object[name] = to_json(value, name);
          params = sampling_params_from_json_value(object);
        });
  }
  cls.def_prop_rw(
      "seed", [](const SamplingParams& params) { return params.seq_seed; },
      [](SamplingParams& params, nb::handle value) {
        json object = sampling_params_json(params);
        object["seq_seed"] = to_json(value, "seed");
        params = sampling_params_from_json_value(object);
      },
      "vLLM's name for seq_seed.");
  cls.def("validate", &SamplingParams::validate,
          "Raises deepinfer.Error naming the first invalid field.");
  cls.def_prop_ro("is_greedy", &SamplingParams::is_greedy,
                  "True when temperature is below 1e-5: argmax sampling.");
  cls.def("to_json", &sampling_params_to_json, "Every field, as a JSON object text.");
  cls.def_static(
      "from_json", [](const std::string& text) { return sampling_params_from_json(text); },
      "text"_a, "The inverse of to_json(); the keys are the keyword names.");
  cls.def(
      "to_dict",
      [](const SamplingParams& params) { return from_json(sampling_params_json(params)); },
      "Every field as a dict: SamplingParams(**params.to_dict()) == params.");
  cls.def("clone", [](const SamplingParams& params) { return SamplingParams(params); });
  cls.def("__copy__", [](const SamplingParams& params) { return SamplingParams(params); });
  cls.def("__deepcopy__",
          [](const SamplingParams& params, nb::handle) { return SamplingParams(params); });
  cls.def("__getstate__", &sampling_params_to_json);
  cls.def("__setstate__", [](SamplingParams& self, const std::string& state) {
    new (&self) SamplingParams(sampling_params_from_json(state));
  });
  cls.def("__eq__", [](const SamplingParams& a, const SamplingParams& b) { return a == b; });
  cls.def("__repr__", &sampling_params_repr);
}

// ---------------------------------------------------------------------------------- EngineArgs

using EngineArgsSetter = std::function<void(EngineArgs&, nb::handle)>;
using EngineArgsSetters = std::map<std::string, EngineArgsSetter, std::less<>>;

template <typename T>
struct is_optional : std::false_type {};
template <typename T>
struct is_optional<std::optional<T>> : std::true_type {};

template <typename T>
constexpr const char* expected_type() {
  if constexpr (std::is_same_v<T, bool>) return "a bool";
  if constexpr (std::is_same_v<T, float>) return "a float";
  if constexpr (std::is_same_v<T, std::string>) return "a str or os.PathLike";
  if constexpr (std::is_same_v<T, uint64_t>) return "an int in [0, 2**64)";
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    return sizeof(T) == 4 ? "an int that fits in 32 bits" : "an int that fits in 64 bits";
  }
}

template <typename T>
T cast_field(const char* name, nb::handle value) {
  if constexpr (is_optional<T>::value) {
    if (value.is_none()) return std::nullopt;  // unset: resolved() picks the default
    return cast_field<typename T::value_type>(name, value);
  } else {
    if constexpr (std::is_same_v<T, std::string>) {
      if (value.is_none()) return {};  // unset: resolved() picks the default
      if (!nb::isinstance<nb::str>(value) && nb::hasattr(value, "__fspath__")) {
        return cast_field<T>(name, value.attr("__fspath__")());
      }
    }
    // A float where an int is expected would silently truncate; a bool where an int is
    // expected is most likely a mistake too.
    constexpr bool wants_int = std::is_integral_v<T> && !std::is_same_v<T, bool>;
    const bool mismatched =
        (wants_int && (PyFloat_Check(value.ptr()) || PyBool_Check(value.ptr()))) ||
        (std::is_same_v<T, bool> && !PyBool_Check(value.ptr()));
    T result{};
    if (mismatched || !nb::try_cast<T>(value, result)) {
      DI_THROW("EngineArgs.", name, " must be ", expected_type<T>(), ", got ",
               python_type_name(value), " ", nb::cast<std::string>(nb::repr(value)));
    }
    if constexpr (std::is_same_v<T, float>) {
      if (std::isnan(result)) DI_THROW("EngineArgs.", name, " must be a number, got nan");
    }
    return result;
  }
}

template <typename T>
void add_field(nb::class_<EngineArgs>& cls, EngineArgsSetters& setters, const char* name,
               T EngineArgs::*member, const char* doc) {
  auto setter = [name, member](EngineArgs& args, nb::handle value) {
    args.*member = cast_field<T>(name, value);
  };
  cls.def_prop_rw(
      name, [member](const EngineArgs& args) { return args.*member; }, setter, doc);
  setters.emplace(name, setter);
}

std::optional<Accelerator> accelerator_from_python(nb::handle value) {
  if (value.is_none()) return std::nullopt;
  const std::string name = nb::isinstance<nb::str>(value) ? nb::cast<std::string>(value) : "";
  if (name == "cpu") return Accelerator::kCpu;
  if (name == "nvidia" || name == "cuda") return Accelerator::kNvidia;
  DI_THROW("EngineArgs.accelerator must be 'cpu', 'nvidia' or None, got ",
           nb::cast<std::string>(nb::repr(value)));
}

nb::object accelerator_to_python(const std::optional<Accelerator>& accelerator) {
  if (!accelerator) return nb::none();
  return nb::str(*accelerator == Accelerator::kCpu ? "cpu" : "nvidia");
}

void bind_engine_args(nb::module_& module) {
  nb::class_<EngineArgs> cls(
      module, "EngineArgs",
      "Engine construction arguments (include/deepinfer/engine_args.h). Keywords only; "
      "unknown names and bad types raise deepinfer.Error naming the field; values are "
      "checked when the LLM starts (or by resolved()).");
  auto setters = std::make_shared<EngineArgsSetters>();
  add_field(cls, *setters, "model", &EngineArgs::model,
            "Checkpoint directory; empty: DEEPINFER_HF_MODEL_DIR, else the default model.");
  add_field(cls, *setters, "tokenizer", &EngineArgs::tokenizer,
            "Directory of tokenizer.json; empty: the model's directory.");
  add_field(cls, *setters, "max_model_len", &EngineArgs::max_model_len,
            "Longest prompt + output; 0: min(the model's maximum, 4096).");
  add_field(cls, *setters, "max_num_seqs", &EngineArgs::max_num_seqs,
            "Cap on requests running at once.");
  add_field(cls, *setters, "max_num_batched_tokens", &EngineArgs::max_num_batched_tokens,
            "Token budget of one step.");
  add_field(cls, *setters, "memory_fraction", &EngineArgs::memory_fraction,
            "Fraction of the memory free after the weights that the state slots may take; "
            "engine creation fails naming it when they do not fit.");
  add_field(cls, *setters, "state_pool_bytes", &EngineArgs::state_pool_bytes,
            "Explicit state pool size in bytes; overrides memory_fraction when > 0.");
  add_field(cls, *setters, "seed", &EngineArgs::seed, "Seed of requests without seq_seed.");
  add_field(cls, *setters, "async_scheduling", &EngineArgs::async_scheduling,
            "Plan step N+1 while step N runs.");
  add_field(cls, *setters, "batch_invariant", &EngineArgs::batch_invariant,
            "Fixed reduction order whatever the batch; None: DEEPINFER_BATCH_INVARIANT, else "
            "True (always true on the CPU backend).");
  add_field(cls, *setters, "num_threads", &EngineArgs::num_threads,
            "CPU kernel threads; 0: DEEPINFER_NUM_THREADS, else all cores.");
  auto set_accelerator = [](EngineArgs& args, nb::handle value) {
    args.accelerator = accelerator_from_python(value);
  };
  cls.def_prop_rw(
      "accelerator", [](const EngineArgs& args) { return accelerator_to_python(args.accelerator); },
      set_accelerator, "'cpu', 'nvidia' or None (DEEPINFER_ACCELERATOR, else cpu).");
  setters->emplace("accelerator", set_accelerator);

  cls.def(
      "__init__",
      [setters](EngineArgs* self, const nb::kwargs& kwargs) {
        EngineArgs args;
        for (auto [key, value] : kwargs) {
          const auto name = nb::cast<std::string>(key);
          const auto setter = setters->find(name);
          if (setter == setters->end()) {
            std::string known;
            for (const auto& [field, unused] : *setters)
              known += (known.empty() ? "" : ", ") + field;
            DI_THROW("EngineArgs has no field '", name, "' (fields: ", known, ")");
          }
          setter->second(args, value);
        }
        new (self) EngineArgs(std::move(args));
      },
      "Keyword arguments only: the field names of EngineArgs.");
  cls.def("resolved", &EngineArgs::resolved,
          "A copy with unset fields filled from the environment and defaults; raises "
          "deepinfer.Error naming a bad value.");
  cls.def("__repr__", [setters](nb::handle self) {
    std::string text = "EngineArgs(";
    bool first = true;
    for (const auto& [field, unused] : *setters) {
      text += concat(first ? "" : ", ", field, "=",
                     nb::cast<std::string>(nb::repr(self.attr(field.c_str()))));
      first = false;
    }
    return text + ")";
  });
}

}  // namespace

void bind_params(nb::module_& module) {
  bind_sampling_params(module);
  bind_engine_args(module);
}

}  // namespace deepinfer::python
