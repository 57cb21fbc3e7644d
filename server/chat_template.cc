// Implementation notes: the source is split into segments (text and tags),
// whitespace control is applied to the text, then tags are parsed into a
// tree of Nodes holding Expr trees. Values are JSON (ordered, so dicts keep
// insertion order as in Python) plus an "undefined" flag. Errors inside this
// file are thrown as TemplateError and turned into a Status at Parse and
// Render, so no exception leaves the module.
#include "server/chat_template.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace lair::server {

const char ChatTemplate::kFallbackSource[] =
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

namespace {

using Json = nlohmann::ordered_json;

struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void Fail(const std::string& message) { throw TemplateError(message); }

// A Jinja value: JSON, or undefined (a missing variable, key or attribute).
struct Value {  // NOLINT(bugprone-exception-escape): json moves do not throw
  bool defined = true;
  Json json;
};
Value Undefined() { return Value{false, nullptr}; }
Value Of(Json json) { return Value{true, std::move(json)}; }

// ---------------------------------------------------------------- tokens

struct Token {
  enum Type { kName, kString, kNumber, kOp, kEnd } type;
  std::string text;  // name, operator, or the literal's source
  Json value;        // string or number literal
};

std::vector<Token> Tokenize(std::string_view src) {
  static const char* const kTwoCharOps[] = {"==", "!=", "<=", ">=", "//", "**"};
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < src.size()) {
    char c = src[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_'))
        ++j;
      tokens.push_back({Token::kName, std::string(src.substr(i, j - i)), nullptr});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < src.size() && (std::isdigit(static_cast<unsigned char>(src[j])) ||
                                (src[j] == '.' && !is_float && j + 1 < src.size() &&
                                 std::isdigit(static_cast<unsigned char>(src[j + 1]))))) {
        if (src[j] == '.') is_float = true;
        ++j;
      }
      std::string text(src.substr(i, j - i));
      Json value = is_float ? Json(std::stod(text)) : Json(std::stoll(text));
      tokens.push_back({Token::kNumber, text, value});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string value;
      size_t j = i + 1;
      for (; j < src.size() && src[j] != c; ++j) {
        if (src[j] == '\\' && j + 1 < src.size()) {
          char e = src[++j];
          value += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          value += src[j];
        }
      }
      if (j >= src.size()) Fail("unterminated string literal");
      tokens.push_back({Token::kString, std::string(src.substr(i, j + 1 - i)), value});
      i = j + 1;
    } else {
      std::string op(1, c);
      for (const char* two : kTwoCharOps) {
        if (src.substr(i, 2) == two) op = two;
      }
      if (std::string_view("+-*/%~<>=()[]{}.,:|!").find(c) == std::string_view::npos) {
        Fail("unexpected character '" + op + "'");
      }
      tokens.push_back({Token::kOp, op, nullptr});
      i += op.size();
    }
  }
  tokens.push_back({Token::kEnd, "", nullptr});
  return tokens;
}

// ---------------------------------------------------------------- expressions

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {  // NOLINT(bugprone-exception-escape): json moves do not throw
  enum Kind {
    kLiteral,
    kName,
    kAttr,
    kIndex,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNot,
    kNeg,
    kBinary,
    kAnd,
    kOr,
    kCond,
    kList,
    kDict
  } kind;
  Json literal;          // kLiteral
  std::string name;      // variable, attribute, filter, test or operator
  bool negated = false;  // kTest: `is not`
  std::vector<ExprPtr>
      args;  // subject first (attr, index, slice, call, filter, test), then arguments;
             // kCond: then, condition, else (may be null); kDict: key, value pairs
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // keyword arguments of calls and filters
};

ExprPtr MakeExpr(Expr::Kind kind, std::string name = "") {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->name = std::move(name);
  return e;
}

// Recursive descent with Jinja's precedence, loosest first:
// conditional, or, and, not, comparison, + -, ~, * / // %, unary minus,
// then primary with postfix (.attr [i] (args)) and filters/tests.
class ExprParser {
 public:
  explicit ExprParser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  ExprPtr ParseExpression() { return ParseConditional(); }
  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  bool AtEnd() const { return Peek().type == Token::kEnd; }
  bool IsOp(std::string_view op) const { return Peek().type == Token::kOp && Peek().text == op; }
  bool IsName(std::string_view name) const {
    return Peek().type == Token::kName && Peek().text == name;
  }
  const Token& Next() { return tokens_[std::min(pos_++, tokens_.size() - 1)]; }
  void Expect(std::string_view op) {
    if (!IsOp(op)) Fail("expected '" + std::string(op) + "' but found '" + Peek().text + "'");
    ++pos_;
  }
  std::string ExpectName() {
    if (Peek().type != Token::kName) Fail("expected a name but found '" + Peek().text + "'");
    return Next().text;
  }
  void ExpectEnd() {
    if (!AtEnd()) Fail("unexpected '" + Peek().text + "'");
  }

 private:
  ExprPtr ParseConditional() {
    ExprPtr then = ParseOr();
    if (!IsName("if")) return then;
    ++pos_;
    auto e = MakeExpr(Expr::kCond);
    e->args.push_back(std::move(then));
    e->args.push_back(ParseOr());
    if (IsName("else")) {
      ++pos_;
      e->args.push_back(ParseConditional());
    } else {
      e->args.push_back(nullptr);
    }
    return e;
  }
  ExprPtr ParseOr() { return ParseLogical("or", Expr::kOr, &ExprParser::ParseAnd); }
  ExprPtr ParseAnd() { return ParseLogical("and", Expr::kAnd, &ExprParser::ParseNot); }
  ExprPtr ParseLogical(std::string_view word, Expr::Kind kind, ExprPtr (ExprParser::*operand)()) {
    ExprPtr left = (this->*operand)();
    while (IsName(word)) {
      ++pos_;
      auto e = MakeExpr(kind);
      e->args.push_back(std::move(left));
      e->args.push_back((this->*operand)());
      left = std::move(e);
    }
    return left;
  }
  ExprPtr ParseNot() {
    if (!IsName("not")) return ParseCompare();
    ++pos_;
    auto e = MakeExpr(Expr::kNot);
    e->args.push_back(ParseNot());
    return e;
  }
  ExprPtr ParseCompare() {
    ExprPtr left = ParseAdditive();
    while (true) {
      std::string op;
      if (Peek().type == Token::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
           Peek().text == "<=" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        ++pos_;
        op = "in";
      } else if (IsName("not") && Peek(1).type == Token::kName && Peek(1).text == "in") {
        pos_ += 2;
        op = "not in";
      } else {
        return left;
      }
      left = Binary(op, std::move(left), ParseAdditive());
    }
  }
  ExprPtr ParseAdditive() {
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      std::string op = Next().text;
      left = Binary(op, std::move(left), ParseConcat());
    }
    return left;
  }
  ExprPtr ParseConcat() {
    ExprPtr left = ParseMultiplicative();
    while (IsOp("~")) {
      ++pos_;
      left = Binary("~", std::move(left), ParseMultiplicative());
    }
    return left;
  }
  ExprPtr ParseMultiplicative() {
    ExprPtr left = ParseUnary();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = Next().text;
      left = Binary(op, std::move(left), ParseUnary());
    }
    return left;
  }
  ExprPtr ParseUnary() {
    if (IsOp("-")) {
      ++pos_;
      auto e = MakeExpr(Expr::kNeg);
      e->args.push_back(ParseUnary());
      return e;
    }
    return ParseFilters(ParsePostfix(ParsePrimary()));
  }
  static ExprPtr Binary(std::string op, ExprPtr left, ExprPtr right) {
    auto e = MakeExpr(Expr::kBinary, std::move(op));
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Next();
    if (t.type == Token::kString || t.type == Token::kNumber) {
      auto e = MakeExpr(Expr::kLiteral);
      e->literal = t.value;
      // Adjacent string literals concatenate, as in Python.
      while (t.type == Token::kString && Peek().type == Token::kString)
        e->literal = e->literal.get<std::string>() + Next().value.get<std::string>();
      return e;
    }
    if (t.type == Token::kName) {
      if (t.text == "true" || t.text == "True") return Literal(true);
      if (t.text == "false" || t.text == "False") return Literal(false);
      if (t.text == "none" || t.text == "None") return Literal(nullptr);
      return MakeExpr(Expr::kName, t.text);
    }
    if (t.type == Token::kOp && t.text == "(") {
      ExprPtr inner = ParseExpression();
      Expect(")");
      return inner;
    }
    if (t.type == Token::kOp && t.text == "[") {
      auto e = MakeExpr(Expr::kList);
      while (!IsOp("]")) {
        e->args.push_back(ParseExpression());
        if (!IsOp("]")) Expect(",");
      }
      Expect("]");
      return e;
    }
    if (t.type == Token::kOp && t.text == "{") {
      auto e = MakeExpr(Expr::kDict);
      while (!IsOp("}")) {
        e->args.push_back(ParseExpression());
        Expect(":");
        e->args.push_back(ParseExpression());
        if (!IsOp("}")) Expect(",");
      }
      Expect("}");
      return e;
    }
    Fail("unexpected '" + t.text + "' in expression");
  }
  static ExprPtr Literal(Json value) {
    auto e = MakeExpr(Expr::kLiteral);
    e->literal = std::move(value);
    return e;
  }

  ExprPtr ParsePostfix(ExprPtr subject) {
    while (true) {
      if (IsOp(".")) {
        ++pos_;
        auto e = MakeExpr(Expr::kAttr, ExpectName());
        e->args.push_back(std::move(subject));
        subject = std::move(e);
      } else if (IsOp("[")) {
        ++pos_;
        subject = ParseSubscript(std::move(subject));
      } else if (IsOp("(")) {
        auto e = MakeExpr(Expr::kCall);
        e->args.push_back(std::move(subject));
        ParseArguments(*e);
        subject = std::move(e);
      } else {
        return subject;
      }
    }
  }
  ExprPtr ParseSubscript(ExprPtr subject) {
    ExprPtr start = IsOp(":") ? nullptr : ParseExpression();
    if (!IsOp(":")) {
      Expect("]");
      auto e = MakeExpr(Expr::kIndex);
      e->args.push_back(std::move(subject));
      e->args.push_back(std::move(start));
      return e;
    }
    ++pos_;
    ExprPtr stop = IsOp("]") ? nullptr : ParseExpression();
    Expect("]");
    auto e = MakeExpr(Expr::kSlice);
    e->args.push_back(std::move(subject));
    e->args.push_back(std::move(start));
    e->args.push_back(std::move(stop));
    return e;
  }
  // "(" [arg {"," arg}] ")" where arg is expr or name=expr; appends to `e`.
  void ParseArguments(Expr& e) {
    Expect("(");
    while (!IsOp(")")) {
      if (Peek().type == Token::kName && Peek(1).type == Token::kOp && Peek(1).text == "=") {
        std::string key = Next().text;
        ++pos_;
        e.kwargs.emplace_back(key, ParseExpression());
      } else {
        e.args.push_back(ParseExpression());
      }
      if (!IsOp(")")) Expect(",");
    }
    Expect(")");
  }
  ExprPtr ParseFilters(ExprPtr subject) {
    while (true) {
      if (IsOp("|")) {
        ++pos_;
        auto e = MakeExpr(Expr::kFilter, ExpectName());
        e->args.push_back(std::move(subject));
        if (IsOp("(")) ParseArguments(*e);
        subject = ParsePostfix(std::move(e));
      } else if (IsName("is")) {
        ++pos_;
        bool negated = IsName("not");
        if (negated) ++pos_;
        auto e = MakeExpr(Expr::kTest, ExpectName());
        e->negated = negated;
        e->args.push_back(std::move(subject));
        if (IsOp("(")) ParseArguments(*e);
        subject = std::move(e);
      } else {
        return subject;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
};

}  // namespace

// ---------------------------------------------------------------- statements

struct ChatTemplate::Node {
  enum Kind { kSequence, kText, kOutput, kFor, kIf, kSet } kind;
  std::string text;                  // kText
  ExprPtr expr;                      // kOutput value, kFor iterable, kSet value
  std::vector<std::string> targets;  // kFor loop variables; kSet name (and attribute)
  ExprPtr filter;                    // kFor `if` clause (may be null)
  std::vector<std::pair<ExprPtr, std::unique_ptr<Node>>> branches;  // kIf; null condition = else
  std::vector<std::unique_ptr<Node>> children;                      // kSequence, kFor body (one)
};

namespace {

using Node = ChatTemplate::Node;

struct Segment {
  enum Type { kText, kOutput, kStatement, kComment } type;
  std::string body;
};

// Splits `source` into text and tag segments and applies whitespace control
// ("-" strips all whitespace on that side; otherwise block and comment tags
// strip the indentation before them and one newline after them).
std::vector<Segment> Segments(const std::string& source) {
  std::vector<Segment> segments;
  bool trim_next_text = false;     // "-" on the previous tag's closing side
  bool drop_next_newline = false;  // the previous tag was a block or comment (trim_blocks)
  size_t pos = 0;
  while (pos <= source.size()) {
    size_t open = source.find('{', pos);
    while (open != std::string::npos && open + 1 < source.size() && source[open + 1] != '{' &&
           source[open + 1] != '%' && source[open + 1] != '#') {
      open = source.find('{', open + 1);
    }
    if (open != std::string::npos && open + 1 >= source.size()) open = std::string::npos;
    std::string text =
        source.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    if (trim_next_text) {
      text.erase(0, std::min(text.size(), text.find_first_not_of(" \t\r\n")));
    } else if (drop_next_newline) {
      if (text.rfind("\r\n", 0) == 0)
        text.erase(0, 2);
      else if (text.rfind('\n', 0) == 0)
        text.erase(0, 1);
    }
    if (open == std::string::npos) {
      segments.push_back({Segment::kText, text});
      break;
    }
    char kind = source[open + 1];
    const char* close_str = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t close = source.find(close_str, open + 2);
    if (close == std::string::npos)
      Fail(std::string("unclosed tag starting '") + source.substr(open, 20) + "'");
    std::string body = source.substr(open + 2, close - open - 2);
    bool trim_before = !body.empty() && body.front() == '-';
    bool keep_indent = !body.empty() && body.front() == '+';
    bool trim_after = !body.empty() && body.back() == '-';
    if (trim_before || keep_indent) body.erase(0, 1);
    if (trim_after && !body.empty()) body.pop_back();
    bool is_block = kind != '{';
    if (trim_before) {
      size_t end = text.find_last_not_of(" \t\r\n");
      text.erase(end == std::string::npos ? 0 : end + 1);
    } else if (is_block && !keep_indent) {
      size_t line_start = text.find_last_of('\n');
      size_t from = line_start == std::string::npos ? 0 : line_start + 1;
      bool at_line_start = line_start != std::string::npos || pos == 0;
      if (at_line_start && text.find_first_not_of(" \t", from) == std::string::npos)
        text.erase(from);
    }
    segments.push_back({Segment::kText, text});
    if (kind != '#')
      segments.push_back({kind == '{' ? Segment::kOutput : Segment::kStatement, body});
    trim_next_text = trim_after;
    drop_next_newline = is_block;
    pos = close + 2;
  }
  return segments;
}

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  std::unique_ptr<Node> ParseAll() {
    std::string stop;
    auto root = ParseSequence({}, &stop, nullptr);
    return root;
  }

 private:
  // Parses nodes until a statement whose keyword is in `stops`; stores that
  // keyword in *stop and its remaining tokens in *rest. At the end of input
  // *stop is empty (an error when `stops` is not empty).
  std::unique_ptr<Node> ParseSequence(const std::vector<std::string>& stops, std::string* stop,
                                      std::unique_ptr<ExprParser>* rest) {
    auto seq = std::make_unique<Node>();
    seq->kind = Node::kSequence;
    while (pos_ < segments_.size()) {
      Segment& s = segments_[pos_++];
      if (s.type == Segment::kText) {
        if (s.body.empty()) continue;
        auto n = std::make_unique<Node>();
        n->kind = Node::kText;
        n->text = std::move(s.body);
        seq->children.push_back(std::move(n));
      } else if (s.type == Segment::kOutput) {
        ExprParser p(Tokenize(s.body));
        auto n = std::make_unique<Node>();
        n->kind = Node::kOutput;
        n->expr = p.ParseExpression();
        p.ExpectEnd();
        seq->children.push_back(std::move(n));
      } else {
        auto p = std::make_unique<ExprParser>(Tokenize(s.body));
        std::string keyword = p->ExpectName();
        if (std::find(stops.begin(), stops.end(), keyword) != stops.end()) {
          *stop = keyword;
          if (rest) *rest = std::move(p);
          return seq;
        }
        seq->children.push_back(ParseStatement(keyword, *p));
      }
    }
    if (!stops.empty()) Fail("missing {% " + stops.back() + " %}");
    stop->clear();
    return seq;
  }

  std::unique_ptr<Node> ParseStatement(const std::string& keyword, ExprParser& p) {
    auto n = std::make_unique<Node>();
    if (keyword == "for") {
      n->kind = Node::kFor;
      n->targets.push_back(p.ExpectName());
      while (p.IsOp(",")) {
        p.Next();
        n->targets.push_back(p.ExpectName());
      }
      if (!p.IsName("in")) Fail("expected 'in' in for loop");
      p.Next();
      n->expr = p.ParseExpression();
      if (n->expr->kind == Expr::kCond && n->expr->args[2] == nullptr) {
        // `for x in items if cond`: the parser read it as a conditional.
        n->filter = std::move(n->expr->args[1]);
        n->expr = std::move(n->expr->args[0]);
      }
      p.ExpectEnd();
      std::string stop;
      n->children.push_back(ParseSequence({"endfor"}, &stop, nullptr));
    } else if (keyword == "if") {
      n->kind = Node::kIf;
      ExprPtr condition = p.ParseExpression();
      p.ExpectEnd();
      while (true) {
        std::string stop;
        std::unique_ptr<ExprParser> rest;
        auto body = ParseSequence({"elif", "else", "endif"}, &stop, &rest);
        n->branches.emplace_back(std::move(condition), std::move(body));
        if (stop == "endif") break;
        if (stop == "elif") {
          condition = rest->ParseExpression();
        } else {
          if (n->branches.back().first == nullptr) Fail("{% else %} after {% else %}");
          condition = nullptr;
        }
        rest->ExpectEnd();
      }
    } else if (keyword == "set") {
      n->kind = Node::kSet;
      n->targets.push_back(p.ExpectName());
      if (p.IsOp(".")) {
        p.Next();
        n->targets.push_back(p.ExpectName());
      }
      p.Expect("=");
      n->expr = p.ParseExpression();
      p.ExpectEnd();
    } else {
      Fail("unsupported tag {% " + keyword + " %}");
    }
    return n;
  }

  std::vector<Segment> segments_;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------- rendering

bool Truthy(const Value& v) {
  if (!v.defined) return false;
  const Json& j = v.json;
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>() != 0;
  if (j.is_number()) return j.get<double>() != 0;
  if (j.is_string()) return !j.get_ref<const std::string&>().empty();
  return !j.empty();
}

std::string FloatText(double d) {
  if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e16) {
    return std::to_string(static_cast<int64_t>(d)) + ".0";
  }
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), d);
  return std::string(buf, result.ptr);
}

std::string Repr(const Json& j);
// Python's str() of a value, as Jinja prints it.
std::string Str(const Value& v) {
  if (!v.defined) return "";
  const Json& j = v.json;
  if (j.is_string()) return j.get<std::string>();
  return Repr(j);
}
std::string Repr(const Json& j) {
  if (j.is_null()) return "None";
  if (j.is_boolean()) return j.get<bool>() ? "True" : "False";
  if (j.is_number_integer()) return std::to_string(j.get<int64_t>());
  if (j.is_number()) return FloatText(j.get<double>());
  if (j.is_string()) return "'" + j.get<std::string>() + "'";
  std::string out = j.is_array() ? "[" : "{";
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!first) out += ", ";
    first = false;
    if (j.is_object()) out += "'" + it.key() + "': ";
    out += Repr(*it);
  }
  return out + (j.is_array() ? "]" : "}");
}

std::string TypeName(const Value& v) {
  if (!v.defined) return "undefined";
  return v.json.type_name();
}

const std::string& AsString(const Value& v, const char* what) {
  if (!v.defined || !v.json.is_string())
    Fail(std::string(what) + " needs a string, got " + TypeName(v));
  return v.json.get_ref<const std::string&>();
}
int64_t AsInt(const Value& v, const char* what) {
  if (!v.defined || !v.json.is_number_integer())
    Fail(std::string(what) + " needs an integer, got " + TypeName(v));
  return v.json.get<int64_t>();
}

std::string Strip(const std::string& s, bool left, bool right,
                  const std::string& chars = " \t\r\n\f\v") {
  size_t b = left ? s.find_first_not_of(chars) : 0;
  if (b == std::string::npos) return "";
  size_t e = right ? s.find_last_not_of(chars) : s.size() - 1;
  return s.substr(b, e - b + 1);
}

std::string CaseMap(std::string s, int mode) {  // 0 lower, 1 upper, 2 title, 3 capitalize
  bool word_start = true;
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    bool upper = mode == 1 || (mode == 2 && word_start) || (mode == 3 && i == 0);
    s[i] = static_cast<char>(upper ? std::toupper(c) : std::tolower(c));
    word_start = !std::isalnum(c);
  }
  return s;
}

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

// Python slice bounds for a sequence of `size`, step 1.
std::pair<int64_t, int64_t> SliceBounds(int64_t size, const Value* start, const Value* stop) {
  auto clamp = [size](int64_t i) { return std::clamp(i < 0 ? i + size : i, int64_t{0}, size); };
  int64_t b = start ? clamp(AsInt(*start, "slice start")) : 0;
  int64_t e = stop ? clamp(AsInt(*stop, "slice stop")) : size;
  return {b, std::max(b, e)};
}

class Renderer {
 public:
  explicit Renderer(const Json& variables) {
    scopes_.emplace_back();
    for (auto it = variables.begin(); it != variables.end(); ++it) scopes_[0][it.key()] = Of(*it);
  }

  void Exec(const Node& n) {
    switch (n.kind) {
      case Node::kSequence:
        for (const auto& child : n.children) Exec(*child);
        break;
      case Node::kText:
        out_ += n.text;
        break;
      case Node::kOutput:
        out_ += Str(Eval(*n.expr));
        break;
      case Node::kFor:
        ExecFor(n);
        break;
      case Node::kIf:
        for (const auto& [condition, body] : n.branches) {
          if (condition == nullptr || Truthy(Eval(*condition))) {
            Exec(*body);
            break;
          }
        }
        break;
      case Node::kSet: {
        Value v = Eval(*n.expr);
        if (n.targets.size() == 1) {
          scopes_.back()[n.targets[0]] = std::move(v);
          break;
        }
        Value* ns = Find(n.targets[0]);
        if (ns == nullptr || !ns->json.is_object())
          Fail("cannot set attribute of '" + n.targets[0] + "'");
        ns->json[n.targets[1]] = v.json;
        break;
      }
    }
  }

  std::string TakeOutput() { return std::move(out_); }

 private:
  void ExecFor(const Node& n) {
    Value iterable = Eval(*n.expr);
    std::vector<Json> items;
    if (iterable.defined) {
      const Json& j = iterable.json;
      if (j.is_array()) {
        items.assign(j.begin(), j.end());
      } else if (j.is_object()) {
        for (auto it = j.begin(); it != j.end(); ++it) items.push_back(it.key());
      } else if (j.is_string()) {
        for (char c : j.get<std::string>()) items.push_back(std::string(1, c));
      } else if (!j.is_null()) {
        Fail("cannot iterate over " + TypeName(iterable));
      }
    }
    if (n.filter) {
      std::vector<Json> kept;
      for (const Json& item : items) {
        scopes_.emplace_back();
        Bind(n.targets, item);
        if (Truthy(Eval(*n.filter))) kept.push_back(item);
        scopes_.pop_back();
      }
      items = std::move(kept);
    }
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      scopes_.emplace_back();
      Bind(n.targets, items[i]);
      scopes_.back()["loop"] = Of(Json{{"index", i + 1},
                                       {"index0", i},
                                       {"revindex", length - i},
                                       {"revindex0", length - i - 1},
                                       {"first", i == 0},
                                       {"last", i == length - 1},
                                       {"length", length}});
      Exec(*n.children[0]);
      scopes_.pop_back();
    }
  }

  void Bind(const std::vector<std::string>& targets, const Json& item) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = Of(item);
      return;
    }
    if (!item.is_array() || item.size() != targets.size())
      Fail("cannot unpack loop item into " + std::to_string(targets.size()) + " names");
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = Of(item[i]);
  }

  Value* Find(const std::string& name) {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      auto it = scope->find(name);
      if (it != scope->end()) return &it->second;
    }
    return nullptr;
  }

  Value Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::kLiteral:
        return Of(e.literal);
      case Expr::kName: {
        Value* v = Find(e.name);
        return v ? *v : Undefined();
      }
      case Expr::kAttr:
      case Expr::kIndex: {
        Value subject = Eval(*e.args[0]);
        Value key = e.kind == Expr::kAttr ? Of(e.name) : Eval(*e.args[1]);
        return Subscript(subject, key, e.kind == Expr::kAttr ? e.name : Repr(key.json));
      }
      case Expr::kSlice: {
        Value subject = Eval(*e.args[0]);
        Value start = e.args[1] ? Eval(*e.args[1]) : Undefined();
        Value stop = e.args[2] ? Eval(*e.args[2]) : Undefined();
        const Json& j = subject.json;
        if (!subject.defined || !(j.is_array() || j.is_string()))
          Fail("cannot slice " + TypeName(subject));
        int64_t size = static_cast<int64_t>(j.size());
        if (j.is_string()) size = static_cast<int64_t>(j.get_ref<const std::string&>().size());
        auto [b, end] =
            SliceBounds(size, e.args[1] ? &start : nullptr, e.args[2] ? &stop : nullptr);
        if (j.is_string()) return Of(j.get<std::string>().substr(b, end - b));
        return Of(Json(j.begin() + b, j.begin() + end));
      }
      case Expr::kCall:
        return Call(e);
      case Expr::kFilter:
        return Filter(e);
      case Expr::kTest: {
        bool result = Test(e);
        return Of(e.negated ? !result : result);
      }
      case Expr::kNot:
        return Of(!Truthy(Eval(*e.args[0])));
      case Expr::kNeg: {
        Value v = Eval(*e.args[0]);
        if (v.json.is_number_integer()) return Of(-v.json.get<int64_t>());
        if (v.json.is_number()) return Of(-v.json.get<double>());
        Fail("cannot negate " + TypeName(v));
      }
      case Expr::kAnd: {
        Value left = Eval(*e.args[0]);
        return Truthy(left) ? Eval(*e.args[1]) : left;
      }
      case Expr::kOr: {
        Value left = Eval(*e.args[0]);
        return Truthy(left) ? left : Eval(*e.args[1]);
      }
      case Expr::kCond:
        if (Truthy(Eval(*e.args[1]))) return Eval(*e.args[0]);
        return e.args[2] ? Eval(*e.args[2]) : Undefined();
      case Expr::kBinary:
        return BinaryOp(e.name, Eval(*e.args[0]), Eval(*e.args[1]));
      case Expr::kList: {
        Json list = Json::array();
        for (const auto& item : e.args) list.push_back(Eval(*item).json);
        return Of(list);
      }
      case Expr::kDict: {
        Json dict = Json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          dict[AsString(Eval(*e.args[i]), "dict key")] = Eval(*e.args[i + 1]).json;
        }
        return Of(dict);
      }
    }
    Fail("bad expression");
  }

  static Value Subscript(const Value& subject, const Value& key, const std::string& label) {
    if (!subject.defined) Fail("cannot read '" + label + "' of an undefined value");
    const Json& j = subject.json;
    if (j.is_object() && key.json.is_string()) {
      auto it = j.find(key.json.get<std::string>());
      return it == j.end() ? Undefined() : Of(*it);
    }
    if ((j.is_array() || j.is_string()) && key.json.is_number_integer()) {
      int64_t size = j.is_string() ? static_cast<int64_t>(j.get_ref<const std::string&>().size())
                                   : static_cast<int64_t>(j.size());
      int64_t i = key.json.get<int64_t>();
      if (i < 0) i += size;
      if (i < 0 || i >= size) return Undefined();
      return j.is_string() ? Of(std::string(1, j.get_ref<const std::string&>()[i])) : Of(j[i]);
    }
    return Undefined();
  }

  static Value BinaryOp(const std::string& op, const Value& a, const Value& b) {
    const Json& x = a.json;
    const Json& y = b.json;
    if (op == "~") return Of(Str(a) + Str(b));
    if (op == "==") return Of(a.defined == b.defined && x == y);
    if (op == "!=") return Of(!(a.defined == b.defined && x == y));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (y.is_string() && x.is_string()) {
        found = y.get_ref<const std::string&>().find(x.get<std::string>()) != std::string::npos;
      } else if (y.is_array()) {
        found = std::find(y.begin(), y.end(), x) != y.end();
      } else if (y.is_object() && x.is_string()) {
        found = y.contains(x.get<std::string>());
      } else if (b.defined && !y.is_null()) {
        Fail("'in' needs a string, list or dict on the right, got " + TypeName(b));
      }
      return Of(op == "in" ? found : !found);
    }
    bool numbers = a.defined && b.defined && x.is_number() && y.is_number() && !x.is_boolean() &&
                   !y.is_boolean();
    bool integers = numbers && x.is_number_integer() && y.is_number_integer();
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      if (!numbers && !(x.is_string() && y.is_string()))
        Fail("cannot compare " + TypeName(a) + " and " + TypeName(b));
      bool less = x < y, greater = y < x;
      return Of(op == "<" ? less : op == ">" ? greater : op == "<=" ? !greater : !less);
    }
    if (op == "+") {
      if (x.is_string() && y.is_string()) return Of(x.get<std::string>() + y.get<std::string>());
      if (x.is_array() && y.is_array()) {
        Json joined = x;
        for (const Json& item : y) joined.push_back(item);
        return Of(joined);
      }
    }
    if (op == "*" && x.is_string() && y.is_number_integer()) {
      std::string out;
      for (int64_t i = 0; i < y.get<int64_t>(); ++i) out += x.get<std::string>();
      return Of(out);
    }
    if (!numbers)
      Fail("unsupported operand types for " + op + ": " + TypeName(a) + " and " + TypeName(b));
    if (integers && op != "/") {
      int64_t p = x.get<int64_t>(), q = y.get<int64_t>();
      if ((op == "//" || op == "%") && q == 0) Fail("integer division by zero");
      if (op == "+") return Of(p + q);
      if (op == "-") return Of(p - q);
      if (op == "*") return Of(p * q);
      int64_t floor_div = p / q - ((p % q != 0) && ((p < 0) != (q < 0)) ? 1 : 0);
      return Of(op == "//" ? floor_div : p - floor_div * q);
    }
    double p = x.get<double>(), q = y.get<double>();
    if (op == "+") return Of(p + q);
    if (op == "-") return Of(p - q);
    if (op == "*") return Of(p * q);
    if (q == 0) Fail("division by zero");
    if (op == "/") return Of(p / q);
    if (op == "//") return Of(std::floor(p / q));
    return Of(p - std::floor(p / q) * q);
  }

  std::vector<Value> Args(const Expr& e) {
    std::vector<Value> args;
    for (size_t i = 1; i < e.args.size(); ++i) args.push_back(Eval(*e.args[i]));
    return args;
  }

  Value Call(const Expr& e) {
    const Expr& callee = *e.args[0];
    std::vector<Value> args = Args(e);
    if (callee.kind == Expr::kAttr) return Method(Eval(*callee.args[0]), callee.name, args);
    if (callee.kind != Expr::kName) Fail("only named functions and methods can be called");
    if (callee.name == "raise_exception") {
      Fail(args.empty() ? "raise_exception" : Str(args[0]));
    }
    if (callee.name == "namespace") {
      Json ns = Json::object();
      for (const auto& [key, value] : e.kwargs) ns[key] = Eval(*value).json;
      return Of(ns);
    }
    if (callee.name == "range") {
      if (args.empty() || args.size() > 2) Fail("range takes one or two arguments");
      int64_t start = args.size() == 2 ? AsInt(args[0], "range") : 0;
      int64_t stop = AsInt(args.back(), "range");
      Json list = Json::array();
      for (int64_t i = start; i < stop; ++i) list.push_back(i);
      return Of(list);
    }
    Fail("unknown function '" + callee.name + "'");
  }

  static Value Method(const Value& self, const std::string& name, const std::vector<Value>& args) {
    const Json& j = self.json;
    if (self.defined && j.is_string()) {
      const std::string& s = j.get_ref<const std::string&>();
      std::string chars = args.empty() ? " \t\r\n\f\v" : AsString(args[0], name.c_str());
      if (name == "strip") return Of(Strip(s, true, true, chars));
      if (name == "lstrip") return Of(Strip(s, true, false, chars));
      if (name == "rstrip") return Of(Strip(s, false, true, chars));
      if (name == "lower") return Of(CaseMap(s, 0));
      if (name == "upper") return Of(CaseMap(s, 1));
      if (name == "title") return Of(CaseMap(s, 2));
      if (name == "startswith") return Of(s.rfind(chars, 0) == 0);
      if (name == "endswith")
        return Of(s.size() >= chars.size() &&
                  s.compare(s.size() - chars.size(), chars.size(), chars) == 0);
      if (name == "replace" && args.size() == 2)
        return Of(ReplaceAll(s, chars, AsString(args[1], "replace")));
      if (name == "split") {
        Json parts = Json::array();
        if (args.empty()) {
          size_t i = 0;
          while ((i = s.find_first_not_of(" \t\r\n", i)) != std::string::npos) {
            size_t end = s.find_first_of(" \t\r\n", i);
            parts.push_back(s.substr(i, end == std::string::npos ? std::string::npos : end - i));
            i = end;
          }
        } else {
          if (chars.empty()) Fail("split: empty separator");
          size_t i = 0, at;
          while ((at = s.find(chars, i)) != std::string::npos) {
            parts.push_back(s.substr(i, at - i));
            i = at + chars.size();
          }
          parts.push_back(s.substr(i));
        }
        return Of(parts);
      }
    }
    if (self.defined && j.is_object()) {
      if (name == "items") {
        Json items = Json::array();
        for (auto it = j.begin(); it != j.end(); ++it)
          items.push_back(Json::array({it.key(), *it}));
        return Of(items);
      }
      if (name == "keys" || name == "values") {
        Json out = Json::array();
        for (auto it = j.begin(); it != j.end(); ++it)
          out.push_back(name == "keys" ? Json(it.key()) : *it);
        return Of(out);
      }
      if (name == "get" && !args.empty()) {
        auto it = j.find(AsString(args[0], "get"));
        if (it != j.end()) return Of(*it);
        return args.size() > 1 ? args[1] : Of(nullptr);
      }
    }
    Fail("unknown method '" + name + "' on " + TypeName(self));
  }

  Value Filter(const Expr& e) {
    Value v = Eval(*e.args[0]);
    std::vector<Value> args = Args(e);
    const std::string& f = e.name;
    const Json& j = v.json;
    if (f == "default" || f == "d") {
      bool use_default = !v.defined || (args.size() > 1 && Truthy(args[1]) && !Truthy(v));
      return use_default ? (args.empty() ? Of("") : args[0]) : v;
    }
    if (f == "length" || f == "count") {
      if (!v.defined) return Of(0);
      if (j.is_string()) return Of(static_cast<int64_t>(j.get_ref<const std::string&>().size()));
      if (j.is_array() || j.is_object()) return Of(static_cast<int64_t>(j.size()));
      Fail("length of " + TypeName(v));
    }
    if (f == "string") return Of(Str(v));
    if (f == "trim") return Of(Strip(Str(v), true, true));
    if (f == "upper") return Of(CaseMap(Str(v), 1));
    if (f == "lower") return Of(CaseMap(Str(v), 0));
    if (f == "title") return Of(CaseMap(Str(v), 2));
    if (f == "capitalize") return Of(CaseMap(Str(v), 3));
    if (f == "replace" && args.size() == 2)
      return Of(ReplaceAll(Str(v), AsString(args[0], "replace"), AsString(args[1], "replace")));
    if (f == "tojson") {
      int indent = -1;
      for (const auto& [key, value] : e.kwargs) {
        if (key == "indent") indent = static_cast<int>(AsInt(Eval(*value), "tojson indent"));
      }
      return Of(j.dump(indent));
    }
    if (f == "int") {
      if (j.is_number()) return Of(static_cast<int64_t>(j.get<double>()));
      if (j.is_string()) {
        int64_t out = 0;
        const std::string& s = j.get_ref<const std::string&>();
        std::from_chars(s.data(), s.data() + s.size(), out);
        return Of(out);
      }
      return Of(0);
    }
    if (f == "float") {
      if (j.is_number()) return Of(j.get<double>());
      return Of(j.is_string() ? std::strtod(j.get<std::string>().c_str(), nullptr) : 0.0);
    }
    if (f == "items") return Method(v, "items", {});
    if (f == "list" || f == "first" || f == "last" || f == "reverse" || f == "join") {
      Json list = Json::array();
      if (j.is_array())
        list = j;
      else if (j.is_string())
        for (char c : j.get<std::string>()) list.push_back(std::string(1, c));
      else if (j.is_object())
        for (auto it = j.begin(); it != j.end(); ++it) list.push_back(it.key());
      else if (v.defined)
        Fail(f + " of " + TypeName(v));
      if (f == "list") return Of(list);
      if (f == "first") return list.empty() ? Undefined() : Of(list.front());
      if (f == "last") return list.empty() ? Undefined() : Of(list.back());
      if (f == "reverse") {
        if (j.is_string())
          return Of(std::string(j.get<std::string>().rbegin(), j.get<std::string>().rend()));
        std::reverse(list.begin(), list.end());
        return Of(list);
      }
      std::string sep = args.empty() ? "" : AsString(args[0], "join");
      std::string out;
      for (size_t i = 0; i < list.size(); ++i) out += (i ? sep : "") + Str(Of(list[i]));
      return Of(out);
    }
    Fail("unknown filter '" + f + "'");
  }

  bool Test(const Expr& e) {
    Value v = Eval(*e.args[0]);
    const Json& j = v.json;
    const std::string& t = e.name;
    if (t == "defined") return v.defined;
    if (t == "undefined") return !v.defined;
    if (!v.defined) return false;
    if (t == "none") return j.is_null();
    if (t == "string") return j.is_string();
    if (t == "number") return j.is_number();
    if (t == "integer") return j.is_number_integer();
    if (t == "boolean") return j.is_boolean();
    if (t == "true") return j.is_boolean() && j.get<bool>();
    if (t == "false") return j.is_boolean() && !j.get<bool>();
    if (t == "mapping") return j.is_object();
    if (t == "sequence" || t == "iterable") return j.is_array() || j.is_string() || j.is_object();
    if (t == "even" || t == "odd")
      return j.is_number_integer() && (j.get<int64_t>() % 2 == 0) == (t == "even");
    Fail("unknown test '" + t + "'");
  }

  std::vector<std::map<std::string, Value>> scopes_;  // globals first, innermost last
  std::string out_;
};

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(const std::string& source) {
  try {
    TemplateParser parser(Segments(source));
    return ChatTemplate(parser.ParseAll());
  } catch (const TemplateError& e) {
    return absl::InvalidArgumentError(std::string("chat template: ") + e.what());
  } catch (const std::exception& e) {  // number parsing of a malformed literal
    return absl::InvalidArgumentError(std::string("chat template: ") + e.what());
  }
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& variables) const {
  try {
    Renderer renderer(variables);
    renderer.Exec(*root_);
    return renderer.TakeOutput();
  } catch (const TemplateError& e) {
    return absl::InvalidArgumentError(std::string("chat template: ") + e.what());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(std::string("chat template: ") + e.what());
  }
}

}  // namespace lair::server
