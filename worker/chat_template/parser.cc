// One file on purpose: a recursive-descent parser whose statement and
// expression rules call each other (grammar in parser.h).
#include "worker/chat_template/parser.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "worker/chat_template/absl_view.h"
#include "worker/chat_template/builtins.h"
#include "worker/chat_template/lexer.h"

namespace tandem::chat_template {
namespace {

absl::Status SyntaxError(int line, std::string_view message) {
  return absl::InvalidArgumentError(LineMessage(line, message));
}

absl::Status Unsupported(int line, std::string_view what) {
  return absl::UnimplementedError(LineMessage(line, absl::StrCat(AV(what), " is not supported")));
}

bool IsConstantName(std::string_view n) {
  return n == "true" || n == "false" || n == "True" || n == "False" || n == "none" || n == "None";
}

// Tags jinja2 knows that this subset refuses.
constexpr std::string_view kUnsupportedTags[] = {"block", "extends",    "include", "import", "from",
                                                 "with",  "autoescape", "call",    "filter"};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const Limits& limits) : tokens_(std::move(tokens)), limits_(limits) {}

  absl::StatusOr<TemplateAst> Parse() {
    TemplateAst ast;
    ASSIGN_OR_RETURN(ast.body, Subparse(nullptr));
    return ast;
  }

 private:
  using Ends = std::vector<std::string_view>;

  // Open blocks, innermost last: (tag, line, closing tags) for errors.
  struct OpenBlock {
    std::string tag;
    int line;
    Ends ends;
  };

  class DepthGuard {
   public:
    explicit DepthGuard(Parser* p) : p_(p) { ++p_->depth_; }
    ~DepthGuard() { --p_->depth_; }
    bool exceeded() const { return p_->depth_ > p_->limits_.max_nesting; }

   private:
    Parser* p_;
  };

  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  static bool IsName(const Token& t, std::string_view v) { return t.type == TokenType::kName && t.text == v; }
  static bool IsOp(const Token& t, std::string_view v) { return t.type == TokenType::kOperator && t.text == v; }
  bool SkipName(std::string_view v) {
    if (!IsName(Cur(), v)) return false;
    Next();
    return true;
  }
  bool SkipOp(std::string_view v) {
    if (!IsOp(Cur(), v)) return false;
    Next();
    return true;
  }

  static std::string Describe(const Token& t) {
    switch (t.type) {
      case TokenType::kName:
      case TokenType::kOperator:
        return t.text;
      case TokenType::kString:
        return "string";
      case TokenType::kInteger:
        return "integer";
      case TokenType::kFloat:
        return "float";
      case TokenType::kData:
        return "template data / text";
      case TokenType::kVariableBegin:
        return "begin of print statement";
      case TokenType::kVariableEnd:
        return "end of print statement";
      case TokenType::kBlockBegin:
        return "begin of statement block";
      case TokenType::kBlockEnd:
        return "end of statement block";
      case TokenType::kEof:
        return "end of template";
    }
    return "token";
  }

  absl::Status Unexpected(std::string_view expected) const {
    return SyntaxError(Cur().line, absl::StrCat("expected ", AV(expected), ", got '", Describe(Cur()), "'"));
  }

  absl::Status ExpectOp(std::string_view op) {
    if (!SkipOp(op)) return Unexpected(absl::StrCat("'", AV(op), "'"));
    return absl::OkStatus();
  }
  absl::Status ExpectName(std::string_view name) {
    if (!SkipName(name)) return Unexpected(absl::StrCat("'", AV(name), "'"));
    return absl::OkStatus();
  }
  absl::Status Expect(TokenType type, std::string_view what) {
    if (Cur().type != type) return Unexpected(what);
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectAnyName() {
    if (Cur().type != TokenType::kName) return Unexpected("a name");
    std::string n = Cur().text;
    Next();
    return n;
  }

  ExprPtr NewExpr(ExprType type, int line) {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->line = line;
    return e;
  }

  // Records the subtree height; refuses trees deeper than the limit (they
  // would recurse that deep when rendered).
  absl::StatusOr<ExprPtr> Done(ExprPtr e) {
    int d = 0;
    for (const auto& o : e->operands) {
      if (o) d = std::max(d, o->depth);
    }
    for (const auto& k : e->keywords) d = std::max(d, k.value->depth);
    e->depth = d + 1;
    if (e->depth > limits_.max_nesting) return NestingError(e->line);
    return e;
  }

  absl::Status NestingError(int line) const {
    return absl::ResourceExhaustedError(
        LineMessage(line, absl::StrCat("the template nests more than ", limits_.max_nesting, " levels deep")));
  }

  // ---- statements ----

  absl::StatusOr<Body> Subparse(const Ends* ends) {
    Body body;
    std::vector<OutputItem> pending;
    int pending_line = 0;
    auto flush = [&]() {
      if (pending.empty()) return;
      auto s = std::make_unique<Stmt>();
      s->type = StmtType::kOutput;
      s->line = pending_line;
      s->output = std::move(pending);
      pending.clear();
      body.push_back(std::move(s));
    };
    while (Cur().type != TokenType::kEof) {
      const Token& t = Cur();
      if (pending.empty()) pending_line = t.line;
      if (t.type == TokenType::kData) {
        pending.push_back(OutputItem{t.text, nullptr});
        Next();
      } else if (t.type == TokenType::kVariableBegin) {
        Next();
        ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, {}, false));
        RETURN_IF_ERROR(Expect(TokenType::kVariableEnd, "'}}'"));
        pending.push_back(OutputItem{"", std::move(e)});
      } else if (t.type == TokenType::kBlockBegin) {
        flush();
        Next();
        if (ends != nullptr && Cur().type == TokenType::kName &&
            std::find(ends->begin(), ends->end(), Cur().text) != ends->end()) {
          return body;
        }
        ASSIGN_OR_RETURN(StmtPtr s, ParseStatement());
        body.push_back(std::move(s));
        RETURN_IF_ERROR(Expect(TokenType::kBlockEnd, "'%}'"));
      } else {
        return SyntaxError(t.line, absl::StrCat("unexpected '", Describe(t), "'"));
      }
    }
    flush();
    return body;
  }

  static std::string Quoted(const Ends& ends) {
    std::vector<std::string> q;
    for (auto e : ends) q.push_back(absl::StrCat("'", AV(e), "'"));
    return absl::StrJoin(q, " or ");
  }

  // After a tag's arguments: `%}`, the body up to one of `ends`. The
  // stream is left at the end tag's name (consumed with drop_needle).
  absl::StatusOr<Body> ParseStatements(const std::string& tag, int line, const Ends& ends, bool drop_needle) {
    SkipOp(":");
    RETURN_IF_ERROR(Expect(TokenType::kBlockEnd, "'%}'"));
    DepthGuard guard(this);
    if (guard.exceeded()) return NestingError(line);
    open_.push_back(OpenBlock{tag, line, ends});
    ASSIGN_OR_RETURN(Body body, Subparse(&ends));
    open_.pop_back();
    if (Cur().type == TokenType::kEof) {
      return SyntaxError(
          Cur().line, absl::StrCat("unexpected end of template: '", tag, "' on line ", line, " needs ", Quoted(ends)));
    }
    if (drop_needle) Next();
    return body;
  }

  absl::StatusOr<StmtPtr> ParseStatement() {
    const Token& t = Cur();
    if (t.type != TokenType::kName) return SyntaxError(t.line, "tag name expected");
    const std::string name = t.text;
    const int line = t.line;
    if (name == "for") return ParseFor();
    if (name == "if") return ParseIf();
    if (name == "set") return ParseSet();
    if (name == "macro") return ParseMacro();
    if (name == "print") return ParsePrint();
    if (name == "generation") {
      Next();
      auto s = std::make_unique<Stmt>();
      s->type = StmtType::kScope;
      s->line = line;
      const int saved = loop_depth_;
      loop_depth_ = 0;
      ASSIGN_OR_RETURN(s->body, ParseStatements("generation", line, {"endgeneration"}, true));
      loop_depth_ = saved;
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return SyntaxError(line, absl::StrCat("'", name, "' outside a loop"));
      Next();
      auto s = std::make_unique<Stmt>();
      s->type = name == "break" ? StmtType::kBreak : StmtType::kContinue;
      s->line = line;
      return s;
    }
    for (auto u : kUnsupportedTags) {
      if (name == u) return Unsupported(line, absl::StrCat("the '", name, "' tag"));
    }
    if (name.rfind("end", 0) == 0 || name == "else" || name == "elif") {
      if (open_.empty()) return SyntaxError(line, absl::StrCat("unexpected '", name, "': no block is open"));
      return SyntaxError(
          line, absl::StrCat("unexpected '", name, "': the innermost open block is '", open_.back().tag, "' on line ",
                             open_.back().line, ", closed by ", Quoted(open_.back().ends)));
    }
    return SyntaxError(line, absl::StrCat("unknown tag '", name, "'"));
  }

  absl::StatusOr<StmtPtr> ParseFor() {
    auto s = std::make_unique<Stmt>();
    s->type = StmtType::kFor;
    s->line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(s->target, ParseAssignTarget(true, false, {"in"}, false));
    RETURN_IF_ERROR(ExpectName("in"));
    ASSIGN_OR_RETURN(s->expr, ParseTuple(false, false, {"recursive"}, false));
    if (SkipName("if")) {
      ASSIGN_OR_RETURN(s->filter, ParseExpression(true));
    }
    if (IsName(Cur(), "recursive")) return Unsupported(Cur().line, "a recursive loop");
    ++loop_depth_;
    ASSIGN_OR_RETURN(s->body, ParseStatements("for", s->line, {"endfor", "else"}, false));
    --loop_depth_;
    const bool has_else = IsName(Cur(), "else");
    Next();
    if (has_else) {
      ASSIGN_OR_RETURN(s->else_body, ParseStatements("for", s->line, {"endfor"}, true));
    }
    // jinja2 refuses, at compile time, any assignment to `loop` inside a loop.
    if (const Target* t = LoopAssignment(s->target)) {
      return SyntaxError(t->line, "can't assign to special loop variable in for-loop target");
    }
    for (const Body* b : {&s->body, &s->else_body}) {
      if (const Target* t = LoopAssignment(*b)) {
        return SyntaxError(t->line, "can't assign to special loop variable in for-loop target");
      }
    }
    return s;
  }

  static const Target* LoopAssignment(const Target& t) {
    if (t.kind == Target::Kind::kName && t.name == "loop") return &t;
    for (const Target& item : t.items) {
      if (const Target* found = LoopAssignment(item)) return found;
    }
    return nullptr;
  }

  static const Target* LoopAssignment(const Body& body) {
    for (const auto& s : body) {
      if (s->type == StmtType::kSet || s->type == StmtType::kSetBlock || s->type == StmtType::kFor) {
        if (const Target* t = LoopAssignment(s->target)) return t;
      }
      for (const auto& b : s->branches) {
        if (const Target* t = LoopAssignment(b.body)) return t;
      }
      if (const Target* t = LoopAssignment(s->body)) return t;
      if (const Target* t = LoopAssignment(s->else_body)) return t;
    }
    return nullptr;
  }

  absl::StatusOr<StmtPtr> ParseIf() {
    auto s = std::make_unique<Stmt>();
    s->type = StmtType::kIf;
    s->line = Cur().line;
    Next();
    while (true) {
      IfBranch branch;
      ASSIGN_OR_RETURN(branch.test, ParseTuple(false, false, {}, false));
      ASSIGN_OR_RETURN(branch.body, ParseStatements("if", s->line, {"elif", "else", "endif"}, false));
      s->branches.push_back(std::move(branch));
      const std::string tag = Cur().text;
      Next();
      if (tag == "elif") continue;
      if (tag == "else") {
        ASSIGN_OR_RETURN(s->else_body, ParseStatements("if", s->line, {"endif"}, true));
      }
      break;
    }
    return s;
  }

  absl::StatusOr<StmtPtr> ParseSet() {
    auto s = std::make_unique<Stmt>();
    s->line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(s->target, ParseAssignTarget(true, false, {}, true));
    if (SkipOp("=")) {
      s->type = StmtType::kSet;
      ASSIGN_OR_RETURN(s->expr, ParseTuple(false, true, {}, false));
      return s;
    }
    if (IsOp(Cur(), "|")) return Unsupported(Cur().line, "a filter on a block set");
    s->type = StmtType::kSetBlock;
    ASSIGN_OR_RETURN(s->body, ParseStatements("set", s->line, {"endset"}, true));
    return s;
  }

  absl::StatusOr<StmtPtr> ParsePrint() {
    auto s = std::make_unique<Stmt>();
    s->type = StmtType::kOutput;
    s->line = Cur().line;
    Next();
    while (Cur().type != TokenType::kBlockEnd) {
      if (!s->output.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
      s->output.push_back(OutputItem{"", std::move(e)});
    }
    return s;
  }

  absl::StatusOr<StmtPtr> ParseMacro() {
    auto s = std::make_unique<Stmt>();
    s->type = StmtType::kMacro;
    s->line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(s->name, ExpectAnyName());
    if (IsConstantName(s->name)) return SyntaxError(s->line, "can't assign to 'const'");
    RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(Cur(), ")")) {
      if (!s->params.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(std::string param, ExpectAnyName());
      if (IsConstantName(param)) return SyntaxError(s->line, "can't assign to 'const'");
      if (SkipOp("=")) {
        ASSIGN_OR_RETURN(ExprPtr d, ParseExpression(true));
        s->defaults.push_back(std::move(d));
      } else if (!s->defaults.empty()) {
        return SyntaxError(Cur().line, "non-default argument follows default argument");
      }
      s->params.push_back(std::move(param));
    }
    RETURN_IF_ERROR(ExpectOp(")"));
    const int saved = loop_depth_;
    loop_depth_ = 0;
    ASSIGN_OR_RETURN(s->body, ParseStatements("macro", s->line, {"endmacro"}, true));
    loop_depth_ = saved;
    for (std::string_view special : {"varargs", "kwargs", "caller"}) {
      if (BodyReads(s->body, special)) {
        return Unsupported(s->line, absl::StrCat("macro '", s->name, "' reads '", AV(special), "', which"));
      }
    }
    return s;
  }

  static bool ExprReads(const Expr* e, std::string_view name) {
    if (e == nullptr) return false;
    if (e->type == ExprType::kName && e->name == name) return true;
    for (const auto& o : e->operands) {
      if (ExprReads(o.get(), name)) return true;
    }
    for (const auto& k : e->keywords) {
      if (ExprReads(k.value.get(), name)) return true;
    }
    return false;
  }

  static bool BodyReads(const Body& body, std::string_view name) {
    for (const auto& s : body) {
      for (const auto& item : s->output) {
        if (ExprReads(item.expr.get(), name)) return true;
      }
      for (const auto& b : s->branches) {
        if (ExprReads(b.test.get(), name) || BodyReads(b.body, name)) return true;
      }
      if (ExprReads(s->expr.get(), name) || ExprReads(s->filter.get(), name)) return true;
      for (const auto& d : s->defaults) {
        if (ExprReads(d.get(), name)) return true;
      }
      if (BodyReads(s->body, name) || BodyReads(s->else_body, name)) return true;
    }
    return false;
  }

  absl::StatusOr<Target> ToTarget(const Expr& e) {
    Target t;
    t.line = e.line;
    if (e.type == ExprType::kName) {
      t.kind = Target::Kind::kName;
      t.name = e.name;
      return t;
    }
    if (e.type == ExprType::kTuple) {
      t.kind = Target::Kind::kTuple;
      for (const auto& item : e.operands) {
        ASSIGN_OR_RETURN(Target sub, ToTarget(*item));
        t.items.push_back(std::move(sub));
      }
      return t;
    }
    return SyntaxError(e.line,
                       e.type == ExprType::kConst ? "can't assign to 'const'" : "can't assign to this expression");
  }

  absl::StatusOr<Target> ParseAssignTarget(bool with_tuple, bool name_only, const Ends& extra_end,
                                           bool with_namespace) {
    if (with_namespace && Cur().type == TokenType::kName && IsOp(Look(), ".")) {
      Target t;
      t.kind = Target::Kind::kNamespaceAttr;
      t.line = Cur().line;
      t.name = Cur().text;
      Next();
      Next();
      ASSIGN_OR_RETURN(t.attr, ExpectAnyName());
      return t;
    }
    ExprPtr e;
    if (with_tuple) {
      ASSIGN_OR_RETURN(e, ParseTuple(true, true, extra_end, false));
    } else {
      ASSIGN_OR_RETURN(e, ParsePrimary());
    }
    return ToTarget(*e);
  }

  // ---- expressions ----

  bool IsTupleEnd(const Ends& extra_end) const {
    const Token& t = Cur();
    if (t.type == TokenType::kVariableEnd || t.type == TokenType::kBlockEnd || IsOp(t, ")")) return true;
    if (t.type == TokenType::kName) {
      return std::find(extra_end.begin(), extra_end.end(), t.text) != extra_end.end();
    }
    return false;
  }

  absl::StatusOr<ExprPtr> ParseTuple(bool simplified, bool with_condexpr, const Ends& extra_end,
                                     bool explicit_parentheses) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd(extra_end)) break;
      ExprPtr item;
      if (simplified) {
        ASSIGN_OR_RETURN(item, ParsePrimary());
      } else {
        ASSIGN_OR_RETURN(item, ParseExpression(with_condexpr));
      }
      items.push_back(std::move(item));
      if (IsOp(Cur(), ",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) return Unexpected("an expression");
    }
    ExprPtr t = NewExpr(ExprType::kTuple, line);
    t->operands = std::move(items);
    return Done(std::move(t));
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) { return with_condexpr ? ParseCondExpr() : ParseOr(); }

  absl::StatusOr<ExprPtr> ParseCondExpr() {
    DepthGuard guard(this);
    if (guard.exceeded()) return NestingError(Cur().line);
    int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr expr1, ParseOr());
    while (SkipName("if")) {
      ASSIGN_OR_RETURN(ExprPtr expr2, ParseOr());
      ExprPtr expr3;
      if (SkipName("else")) {
        ASSIGN_OR_RETURN(expr3, ParseCondExpr());
      }
      ExprPtr c = NewExpr(ExprType::kCondExpr, line);
      c->operands.push_back(std::move(expr2));
      c->operands.push_back(std::move(expr1));
      c->operands.push_back(std::move(expr3));
      ASSIGN_OR_RETURN(expr1, Done(std::move(c)));
      line = Cur().line;
    }
    return expr1;
  }

  absl::StatusOr<ExprPtr> Binary(ExprType type, int line, ExprPtr left, ExprPtr right) {
    ExprPtr e = NewExpr(type, line);
    e->operands.push_back(std::move(left));
    e->operands.push_back(std::move(right));
    return Done(std::move(e));
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (SkipName("or")) {
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      ASSIGN_OR_RETURN(left, Binary(ExprType::kOr, line, std::move(left), std::move(right)));
      line = Cur().line;
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (SkipName("and")) {
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      ASSIGN_OR_RETURN(left, Binary(ExprType::kAnd, line, std::move(left), std::move(right)));
      line = Cur().line;
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName(Cur(), "not")) {
      DepthGuard guard(this);
      if (guard.exceeded()) return NestingError(Cur().line);
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      ExprPtr e = NewExpr(ExprType::kNot, line);
      e->operands.push_back(std::move(operand));
      return Done(std::move(e));
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr expr, ParseMath1());
    ExprPtr cmp;
    static const std::pair<std::string_view, CompareOp> kOps[] = {{"==", CompareOp::kEq}, {"!=", CompareOp::kNe},
                                                                  {"<", CompareOp::kLt},  {"<=", CompareOp::kLe},
                                                                  {">", CompareOp::kGt},  {">=", CompareOp::kGe}};
    while (true) {
      std::optional<CompareOp> op;
      for (const auto& [text, o] : kOps) {
        if (IsOp(Cur(), text)) op = o;
      }
      if (op) {
        Next();
      } else if (SkipName("in")) {
        op = CompareOp::kIn;
      } else if (IsName(Cur(), "not") && IsName(Look(), "in")) {
        Next();
        Next();
        op = CompareOp::kNotIn;
      } else {
        break;
      }
      ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      if (!cmp) {
        cmp = NewExpr(ExprType::kCompare, line);
        cmp->operands.push_back(std::move(expr));
      }
      cmp->compare_ops.push_back(*op);
      cmp->operands.push_back(std::move(operand));
      line = Cur().line;
    }
    if (!cmp) return expr;
    cmp->line = line;
    return Done(std::move(cmp));
  }

  absl::StatusOr<ExprPtr> Arith(BinaryOp op, int line, ExprPtr left, ExprPtr right) {
    ASSIGN_OR_RETURN(ExprPtr e, Binary(ExprType::kBinary, line, std::move(left), std::move(right)));
    e->binary_op = op;
    return e;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp(Cur(), "+") || IsOp(Cur(), "-")) {
      const BinaryOp op = Cur().text == "+" ? BinaryOp::kAdd : BinaryOp::kSub;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      ASSIGN_OR_RETURN(left, Arith(op, line, std::move(left), std::move(right)));
      line = Cur().line;
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    const int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
    if (!IsOp(Cur(), "~")) return first;
    ExprPtr c = NewExpr(ExprType::kConcat, line);
    c->operands.push_back(std::move(first));
    while (SkipOp("~")) {
      ASSIGN_OR_RETURN(ExprPtr next, ParseMath2());
      c->operands.push_back(std::move(next));
    }
    return Done(std::move(c));
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (true) {
      BinaryOp op;
      if (IsOp(Cur(), "*")) {
        op = BinaryOp::kMul;
      } else if (IsOp(Cur(), "/")) {
        op = BinaryOp::kDiv;
      } else if (IsOp(Cur(), "//")) {
        op = BinaryOp::kFloorDiv;
      } else if (IsOp(Cur(), "%")) {
        op = BinaryOp::kMod;
      } else {
        break;
      }
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      ASSIGN_OR_RETURN(left, Arith(op, line, std::move(left), std::move(right)));
      line = Cur().line;
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (SkipOp("**")) {
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      ASSIGN_OR_RETURN(left, Arith(BinaryOp::kPow, line, std::move(left), std::move(right)));
      line = Cur().line;
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    if (guard.exceeded()) return NestingError(Cur().line);
    const int line = Cur().line;
    ExprPtr node;
    if (IsOp(Cur(), "-") || IsOp(Cur(), "+")) {
      const ExprType type = Cur().text == "-" ? ExprType::kNeg : ExprType::kPos;
      Next();
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node = NewExpr(type, line);
      node->operands.push_back(std::move(operand));
      ASSIGN_OR_RETURN(node, Done(std::move(node)));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    DepthGuard guard(this);
    if (guard.exceeded()) return NestingError(Cur().line);
    const Token& t = Cur();
    const int line = t.line;
    if (t.type == TokenType::kName) {
      ExprPtr e = NewExpr(ExprType::kConst, line);
      if (t.text == "true" || t.text == "True") {
        e->constant = Value::Bool(true);
      } else if (t.text == "false" || t.text == "False") {
        e->constant = Value::Bool(false);
      } else if (t.text == "none" || t.text == "None") {
        e->constant = Value::None();
      } else {
        e->type = ExprType::kName;
        e->name = t.text;
      }
      Next();
      return e;
    }
    if (t.type == TokenType::kString) {
      std::string s;
      while (Cur().type == TokenType::kString) {
        s += Cur().text;
        Next();
      }
      ExprPtr e = NewExpr(ExprType::kConst, line);
      e->constant = Value::String(std::move(s));
      return e;
    }
    if (t.type == TokenType::kInteger || t.type == TokenType::kFloat) {
      ExprPtr e = NewExpr(ExprType::kConst, line);
      e->constant = t.type == TokenType::kInteger ? Value::Int(t.int_value) : Value::Float(t.float_value);
      Next();
      return e;
    }
    if (IsOp(t, "(")) {
      Next();
      ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, {}, true));
      RETURN_IF_ERROR(ExpectOp(")"));
      return e;
    }
    if (IsOp(t, "[")) {
      Next();
      ExprPtr e = NewExpr(ExprType::kList, line);
      while (!IsOp(Cur(), "]")) {
        if (!e->operands.empty()) RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(Cur(), "]")) break;
        ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
        e->operands.push_back(std::move(item));
      }
      RETURN_IF_ERROR(ExpectOp("]"));
      return Done(std::move(e));
    }
    if (IsOp(t, "{")) {
      Next();
      ExprPtr e = NewExpr(ExprType::kDict, line);
      while (!IsOp(Cur(), "}")) {
        if (!e->operands.empty()) RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(Cur(), "}")) break;
        ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
        RETURN_IF_ERROR(ExpectOp(":"));
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->operands.push_back(std::move(key));
        e->operands.push_back(std::move(value));
      }
      RETURN_IF_ERROR(ExpectOp("}"));
      return Done(std::move(e));
    }
    return SyntaxError(line, absl::StrCat("unexpected '", Describe(t), "'"));
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(Cur(), ".") || IsOp(Cur(), "[")) {
        ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp(Cur(), "(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp(Cur(), "|")) {
        ASSIGN_OR_RETURN(node, ParseFilter(std::move(node)));
      } else if (IsName(Cur(), "is")) {
        ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp(Cur(), "(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const Token t = Cur();
    Next();
    if (t.text == ".") {
      const Token attr = Cur();
      Next();
      if (attr.type == TokenType::kName) {
        ExprPtr e = NewExpr(ExprType::kGetattr, t.line);
        e->name = attr.text;
        e->operands.push_back(std::move(node));
        return Done(std::move(e));
      }
      if (attr.type != TokenType::kInteger) return SyntaxError(attr.line, "expected name or number");
      ExprPtr index = NewExpr(ExprType::kConst, attr.line);
      index->constant = Value::Int(attr.int_value);
      ExprPtr e = NewExpr(ExprType::kGetitem, t.line);
      e->operands.push_back(std::move(node));
      e->operands.push_back(std::move(index));
      return Done(std::move(e));
    }
    std::vector<ExprPtr> args;
    while (!IsOp(Cur(), "]")) {
      if (!args.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(ExprPtr a, ParseSubscribed());
      args.push_back(std::move(a));
    }
    RETURN_IF_ERROR(ExpectOp("]"));
    if (args.size() != 1) return Unsupported(t.line, "a subscript that is not one index or slice");
    ExprPtr e = NewExpr(ExprType::kGetitem, t.line);
    e->operands.push_back(std::move(node));
    e->operands.push_back(std::move(args[0]));
    return Done(std::move(e));
  }

  absl::StatusOr<ExprPtr> ParseSubscribed() {
    const int line = Cur().line;
    std::vector<ExprPtr> args;
    if (IsOp(Cur(), ":")) {
      Next();
      args.push_back(nullptr);
    } else {
      ASSIGN_OR_RETURN(ExprPtr node, ParseExpression(true));
      if (!IsOp(Cur(), ":")) return node;
      Next();
      args.push_back(std::move(node));
    }
    auto at_end = [&]() { return IsOp(Cur(), "]") || IsOp(Cur(), ","); };
    if (IsOp(Cur(), ":")) {
      args.push_back(nullptr);
    } else if (!at_end()) {
      ASSIGN_OR_RETURN(ExprPtr stop, ParseExpression(true));
      args.push_back(std::move(stop));
    } else {
      args.push_back(nullptr);
    }
    if (IsOp(Cur(), ":")) {
      Next();
      if (!at_end()) {
        ASSIGN_OR_RETURN(ExprPtr step, ParseExpression(true));
        args.push_back(std::move(step));
      } else {
        args.push_back(nullptr);
      }
    } else {
      args.push_back(nullptr);
    }
    ExprPtr e = NewExpr(ExprType::kSlice, line);
    e->operands = std::move(args);
    return Done(std::move(e));
  }

  // `(args, name=value)` appended to e's operands and keywords.
  absl::Status ParseCallArgs(Expr* e) {
    const int line = Cur().line;
    RETURN_IF_ERROR(ExpectOp("("));
    bool require_comma = false;
    while (!IsOp(Cur(), ")")) {
      if (require_comma) {
        RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(Cur(), ")")) break;
      }
      if (IsOp(Cur(), "*") || IsOp(Cur(), "**")) {
        return Unsupported(Cur().line, "*args / **kwargs in a call");
      }
      if (Cur().type == TokenType::kName && IsOp(Look(), "=")) {
        std::string key = Cur().text;
        for (const auto& k : e->keywords) {
          if (k.name == key) return SyntaxError(line, absl::StrCat("keyword argument repeated: ", key));
        }
        Next();
        Next();
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->keywords.push_back(Keyword{std::move(key), std::move(value)});
      } else {
        if (!e->keywords.empty()) return SyntaxError(line, "invalid syntax for function call expression");
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->operands.push_back(std::move(value));
      }
      require_comma = true;
    }
    return ExpectOp(")");
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr node) {
    ExprPtr e = NewExpr(ExprType::kCall, Cur().line);
    e->operands.push_back(std::move(node));
    RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return Done(std::move(e));
  }

  absl::StatusOr<std::string> DottedName() {
    ASSIGN_OR_RETURN(std::string name, ExpectAnyName());
    while (SkipOp(".")) {
      ASSIGN_OR_RETURN(std::string part, ExpectAnyName());
      absl::StrAppend(&name, ".", part);
    }
    return name;
  }

  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr node) {
    while (SkipOp("|")) {
      const int line = Cur().line;
      ASSIGN_OR_RETURN(std::string name, DottedName());
      if (FindFilter(name) == nullptr) {
        if (IsJinjaFilter(name)) return Unsupported(line, absl::StrCat("filter '", name, "'"));
        return SyntaxError(line, absl::StrCat("unknown filter '", name, "'"));
      }
      ExprPtr e = NewExpr(ExprType::kFilter, line);
      e->name = std::move(name);
      e->operands.push_back(std::move(node));
      if (IsOp(Cur(), "(")) RETURN_IF_ERROR(ParseCallArgs(e.get()));
      ASSIGN_OR_RETURN(node, Done(std::move(e)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node) {
    const int line = Cur().line;
    Next();  // is
    const bool negated = SkipName("not");
    ASSIGN_OR_RETURN(std::string name, DottedName());
    if (FindTest(name) == nullptr) {
      if (IsJinjaTest(name)) return Unsupported(line, absl::StrCat("test '", name, "'"));
      return SyntaxError(line, absl::StrCat("unknown test '", name, "'"));
    }
    ExprPtr e = NewExpr(ExprType::kTest, line);
    e->name = std::move(name);
    e->operands.push_back(std::move(node));
    const Token& c = Cur();
    if (IsOp(c, "(")) {
      RETURN_IF_ERROR(ParseCallArgs(e.get()));
    } else if ((c.type == TokenType::kName || c.type == TokenType::kString || c.type == TokenType::kInteger ||
                c.type == TokenType::kFloat || IsOp(c, "[") || IsOp(c, "{")) &&
               !IsName(c, "else") && !IsName(c, "or") && !IsName(c, "and")) {
      if (IsName(c, "is")) return SyntaxError(c.line, "you cannot chain multiple tests with is");
      ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      e->operands.push_back(std::move(arg));
    }
    ASSIGN_OR_RETURN(e, Done(std::move(e)));
    if (!negated) return e;
    ExprPtr n = NewExpr(ExprType::kNot, line);
    n->operands.push_back(std::move(e));
    return Done(std::move(n));
  }

  std::vector<Token> tokens_;
  const Limits& limits_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<OpenBlock> open_;
};

}  // namespace

absl::StatusOr<TemplateAst> ParseTemplate(std::string_view source, const Limits& limits) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return Parser(std::move(tokens), limits).Parse();
}

}  // namespace tandem::chat_template
