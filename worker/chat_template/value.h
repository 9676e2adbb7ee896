// Values of the chat-template interpreter: the Python objects a jinja2
// template handles (undefined, None, bool, int, float, str, list, tuple,
// dict, namespace, ...) with Python's printing (str, repr, json.dumps),
// truth, equality and ordering.
//
// A Value is cheap to copy: strings and containers are shared and immutable
// once built. Two kinds are shared and mutable on purpose: a namespace
// (jinja2's `namespace()`, assigned with `{% set ns.x = ... %}`) and an
// iterator (a generator such as `xs|select(...)`, consumed by iterating).
// Values are used by one rendering thread at a time.
//
// Operations that Python would refuse (str < int, len(generator), printing
// a function, ...) return InvalidArgument with Python's kind of message and
// no template line; the evaluator adds the line.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::chat_template {

class Value;
class Interpreter;

enum class Kind {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,       // list, tuple, range, dict views (SeqKind)
  kDict,       // str keys, insertion order
  kNamespace,  // jinja2 namespace(): mutable attributes
  kIterator,   // single-pass generator
  kObject,     // read-only attributes, not printable (the loop variable)
  kCallable,   // builtin function, bound method or macro
};

// Which Python sequence a kList value is: they print differently and
// compare unequal to each other.
enum class SeqKind { kList, kTuple, kRange, kDictKeys, kDictValues, kDictItems };

// Deepest nesting of containers a template may build or receive.
inline constexpr int kMaxValueDepth = 256;

struct ListData {
  SeqKind kind = SeqKind::kList;
  std::vector<Value> items;
  std::string range_repr;  // "range(0, 3)" for kRange
  int depth = 1;
};

// A dict with string keys in insertion order (Python 3.7+ dict order).
class DictData {
 public:
  const Value* Find(std::string_view key) const;
  // Inserts or replaces; a replaced key keeps its first position.
  void Set(const std::string& key, Value value);
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
  size_t size() const;  // defined below Value (clang needs Value complete)
  int depth() const { return depth_; }
  void Clear();

 private:
  std::vector<std::pair<std::string, Value>> items_;
  std::unordered_map<std::string, size_t> index_;
  int depth_ = 1;
};

struct IteratorData {
  std::string type_name;  // "generator", "reversed"
  std::vector<Value> items;
  size_t pos = 0;
  // A lazy generator that failed part way: raised once `items` run out
  // (jinja2's filters are generators, so their errors surface on use).
  absl::Status error;
};

struct ObjectData {
  std::string type_name;  // "LoopContext"
  DictData attrs;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  int line = 0;  // template line of the call
};
using NativeFunction = std::function<absl::StatusOr<Value>(Interpreter&, CallArgs&)>;
struct CallableData {
  std::string name;
  NativeFunction fn;
};

class Value {
 public:
  Value() = default;                            // undefined, printing as ""
  static Value Undefined(std::string message);  // message: the error when it is used
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(std::vector<Value> items, SeqKind kind = SeqKind::kList);
  static Value Range(std::vector<Value> items, std::string repr);
  static Value Dict(std::shared_ptr<const DictData> d);
  static Value Namespace(std::shared_ptr<DictData> d);
  static Value Iterator(std::string type_name, std::vector<Value> items);
  static Value Object(std::shared_ptr<const ObjectData> o);
  static Value Callable(std::string name, NativeFunction fn);
  // JSON -> Python values as json.loads makes them (objects keep key order).
  static absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(rep_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_string() const { return kind() == Kind::kString; }
  // bool, int or float (Python's numbers; bool is an int).
  bool is_number() const;
  // bool or int
  bool is_integer_like() const { return kind() == Kind::kBool || kind() == Kind::kInt; }

  bool as_bool() const { return std::get<bool>(rep_); }
  int64_t as_int() const;    // bool or int
  double as_double() const;  // any number
  const std::string& str() const { return *std::get<StrRep>(rep_).s; }
  const ListData& list() const { return *std::get<ListRep>(rep_).l; }
  const DictData& dict() const { return *std::get<DictRep>(rep_).d; }
  DictData& ns() const { return *std::get<NsRep>(rep_).d; }
  IteratorData& iter() const { return *std::get<IterRep>(rep_).it; }
  const ObjectData& object() const { return *std::get<ObjRep>(rep_).o; }
  const CallableData& callable() const { return *std::get<CallRep>(rep_).c; }
  const std::shared_ptr<DictData>& ns_ptr() const { return std::get<NsRep>(rep_).d; }
  // The message of the error that using this undefined value raises.
  std::string undefined_message() const;
  // Container nesting depth (0 for scalars).
  int depth() const;
  // Same object (Python `is`) for shared kinds.
  bool SameObject(const Value& other) const;

 private:
  struct UndefRep {
    std::shared_ptr<const std::string> message;
  };
  struct NoneRep {};
  struct StrRep {
    std::shared_ptr<const std::string> s;
  };
  struct ListRep {
    std::shared_ptr<const ListData> l;
  };
  struct DictRep {
    std::shared_ptr<const DictData> d;
  };
  struct NsRep {
    std::shared_ptr<DictData> d;
  };
  struct IterRep {
    std::shared_ptr<IteratorData> it;
  };
  struct ObjRep {
    std::shared_ptr<const ObjectData> o;
  };
  struct CallRep {
    std::shared_ptr<const CallableData> c;
  };
  std::variant<UndefRep, NoneRep, bool, int64_t, double, StrRep, ListRep, DictRep, NsRep, IterRep, ObjRep, CallRep>
      rep_;
};

inline size_t DictData::size() const { return items_.size(); }

// Python's type name: "str", "NoneType", "generator", ...
std::string TypeName(const Value& v);
// Python truth value (undefined is false, a generator is true).
bool Truthy(const Value& v);
// str(v): what {{ v }} prints. Undefined prints "".
absl::StatusOr<std::string> ToStr(const Value& v);
// repr(v)
absl::StatusOr<std::string> Repr(const Value& v);
// v1 == v2 (undefined equals only undefined).
bool Equals(const Value& a, const Value& b);
// Python ordering for <, <=, >, >= (`op` names the operator in the error):
// negative, zero or positive.
absl::StatusOr<int> Compare(const Value& a, const Value& b, std::string_view op);

// json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...)
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;                              // per level; set: newlines between items
  std::optional<std::pair<std::string, std::string>> separators;  // (item, key)
  bool sort_keys = false;
};
absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options);

// The items `for x in v` visits: list items, dict keys, string characters;
// undefined gives none; iterators are consumed (and raise their error).
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);
// len(v); undefined has length 0.
absl::StatusOr<int64_t> Length(const Value& v);
// `item in container`
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

}  // namespace tandem::chat_template
