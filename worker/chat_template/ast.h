// The parsed form of a chat template: expressions and statements of the
// jinja2 subset (see parser.h for what is accepted). Nodes own their
// children; a parsed tree is immutable and may be rendered by several
// threads at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/chat_template/value.h"

namespace tandem::chat_template {

enum class ExprType {
  kConst,     // constant
  kName,      // name
  kList,      // operands: items
  kTuple,     // operands: items
  kDict,      // operands: key0, value0, key1, value1, ...
  kGetattr,   // operands[0].name
  kGetitem,   // operands[0][operands[1]]
  kSlice,     // operands: start, stop, step (null when absent)
  kCall,      // operands[0](operands[1:], keywords)
  kFilter,    // operands[0] | name(operands[1:], keywords)
  kTest,      // operands[0] is name(operands[1:], keywords)
  kNeg,       // -operands[0]
  kPos,       // +operands[0]
  kNot,       // not operands[0]
  kBinary,    // operands[0] binary_op operands[1]
  kAnd,       // operands[0] and operands[1]
  kOr,        // operands[0] or operands[1]
  kConcat,    // operands joined with ~
  kCompare,   // operands[0] compare_ops[0] operands[1] compare_ops[1] ...
  kCondExpr,  // operands[1] if operands[0] else operands[2] (null: undefined)
};

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Keyword {
  std::string name;
  ExprPtr value;
};

struct Expr {
  ExprType type = ExprType::kConst;
  int line = 0;
  int depth = 1;  // height of this subtree
  Value constant;
  std::string name;
  BinaryOp binary_op = BinaryOp::kAdd;
  std::vector<CompareOp> compare_ops;
  std::vector<ExprPtr> operands;
  std::vector<Keyword> keywords;
};

// Left side of set / for: a name, a tuple of targets, or ns.attr.
struct Target {
  enum class Kind { kName, kTuple, kNamespaceAttr };
  Kind kind = Kind::kName;
  std::string name;
  std::string attr;
  std::vector<Target> items;
  int line = 0;
};

enum class StmtType {
  kOutput,    // text and {{ expressions }}
  kIf,        // branches, else_body
  kFor,       // target in expr [if filter]: body, else_body
  kSet,       // target = expr
  kSetBlock,  // {% set target %}body{% endset %}
  kMacro,     // name(params=defaults): body
  kBreak,
  kContinue,
  kScope,  // body rendered in its own scope ({% generation %})
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct OutputItem {
  std::string text;  // used when expr is null
  ExprPtr expr;
};

struct IfBranch {
  ExprPtr test;
  Body body;
};

struct Stmt {
  StmtType type = StmtType::kOutput;
  int line = 0;
  std::vector<OutputItem> output;
  std::vector<IfBranch> branches;
  Target target;
  ExprPtr expr;
  ExprPtr filter;
  Body body;
  Body else_body;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
};

struct TemplateAst {
  Body body;
};

}  // namespace tandem::chat_template
