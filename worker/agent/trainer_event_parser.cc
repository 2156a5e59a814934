#include "worker/agent/trainer_event_parser.h"

#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "common/contract/events.h"
#include "worker/agent/event_json.h"

namespace ddp {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Struct;
using google::protobuf::Value;

// Reads a definition's fields out of a JSON object, noting every mismatch.
class StructReader {
 public:
  // `lenient`: missing fields are not problems (a user's program sends what it knows).
  StructReader(const Struct& in, std::string where, std::vector<std::string>* problems,
               bool lenient = false)
      : in_(in), where_(std::move(where)), problems_(problems), lenient_(lenient) {}

  void operator()(const char* name, int64_t& v, const char*) {
    const Value* x = Find(name);
    if (x == nullptr) return;
    // Within int64 (2^63 itself is out): a larger number would not convert.
    if (!x->has_number_value() || x->number_value() != std::trunc(x->number_value()) ||
        std::fabs(x->number_value()) >= 9223372036854775808.0) {
      Problem(name, "is not an integer");
      return;
    }
    v = static_cast<int64_t>(x->number_value());
  }
  void operator()(const char* name, double& v, const char*) {
    const Value* x = Find(name);
    if (x == nullptr) return;
    if (x->has_null_value()) {
      v = std::nan("");  // The writer's spelling of NaN and infinities.
    } else if (x->has_number_value()) {
      v = x->number_value();
    } else {
      Problem(name, "is not a number");
    }
  }
  void operator()(const char* name, bool& v, const char*) {
    const Value* x = Find(name);
    if (x == nullptr) return;
    if (!x->has_bool_value()) return Problem(name, "is not a boolean");
    v = x->bool_value();
  }
  void operator()(const char* name, std::string& v, const char*) {
    const Value* x = Find(name);
    if (x == nullptr) return;
    if (!x->has_string_value()) return Problem(name, "is not a string");
    v = x->string_value();
  }
  void operator()(const char* name, std::optional<double>& v, const char*) {
    const Value* x = Find(name);
    if (x == nullptr || x->has_null_value()) return;
    if (!x->has_number_value()) return Problem(name, "is not a number or null");
    v = x->number_value();
  }
  template <typename S>
  void operator()(const char* name, std::optional<S>& v, const char*) {
    const Value* x = Find(name);
    if (x == nullptr || x->has_null_value()) return;
    if (!x->has_struct_value()) return Problem(name, "is not an object or null");
    v.emplace();
    StructReader nested(x->struct_value(), absl::StrCat(where_, ".", name), problems_, lenient_);
    S::Fields(*v, nested);
    nested.ReportUnknown({});
  }
  template <typename S>
  void operator()(const char* name, std::vector<S>& v, const char*) {
    const Value* x = Find(name);
    if (x == nullptr) return;
    if (!x->has_list_value()) return Problem(name, "is not an array");
    for (const Value& item : x->list_value().values()) {
      if (!item.has_struct_value()) return Problem(name, "holds something that is not an object");
      v.emplace_back();
      StructReader nested(item.struct_value(), absl::StrCat(where_, ".", name, "[]"), problems_,
                          lenient_);
      S::Fields(v.back(), nested);
      nested.ReportUnknown({});
    }
  }

  // Fields of the object that the definition does not have (the envelope aside).
  void ReportUnknown(const std::set<std::string>& also_known) {
    for (const auto& [key, value] : in_.fields()) {
      if (!seen_.count(key) && !also_known.count(key)) {
        problems_->push_back(absl::StrCat(where_, ": unknown field '", key, "'"));
      }
    }
  }

 private:
  const Value* Find(const char* name) {
    seen_.insert(name);
    auto it = in_.fields().find(name);
    if (it == in_.fields().end()) {
      if (!lenient_) problems_->push_back(absl::StrCat(where_, ": missing field '", name, "'"));
      return nullptr;
    }
    return &it->second;
  }
  void Problem(const char* name, const char* what) {
    problems_->push_back(absl::StrCat(where_, ": field '", name, "' ", what));
  }

  const Struct& in_;
  const std::string where_;
  std::vector<std::string>* problems_;
  const bool lenient_;
  std::set<std::string> seen_;
};

// Copies a definition's fields into the body message's fields of the same name.
// Fields the body does not have are not relayed; a field whose proto type cannot
// hold it is noted in `mismatches` (checked by a test, never expected at run time).
class ProtoWriter {
 public:
  ProtoWriter(google::protobuf::Message* out, std::vector<std::string>* mismatches,
              std::set<std::string>* written)
      : out_(out), mismatches_(mismatches), written_(written) {}

  void operator()(const char* name, const int64_t& v, const char*) {
    const FieldDescriptor* f = Field(name);
    if (f == nullptr) return;
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
      Refl()->SetInt64(out_, f, v);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
      Refl()->SetInt32(out_, f, static_cast<int32_t>(v));
    } else {
      Mismatch(name, "an integer");
    }
  }
  void operator()(const char* name, const double& v, const char*) {
    const FieldDescriptor* f = Field(name);
    if (f == nullptr) return;
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_DOUBLE) return Mismatch(name, "a double");
    Refl()->SetDouble(out_, f, v);
  }
  void operator()(const char* name, const bool& v, const char*) {
    const FieldDescriptor* f = Field(name);
    if (f == nullptr) return;
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_BOOL) return Mismatch(name, "a bool");
    Refl()->SetBool(out_, f, v);
  }
  void operator()(const char* name, const std::string& v, const char*) {
    const FieldDescriptor* f = Field(name);
    if (f == nullptr) return;
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_STRING) return Mismatch(name, "a string");
    Refl()->SetString(out_, f, v);
  }
  void operator()(const char* name, const std::optional<double>& v, const char*) {
    const FieldDescriptor* f = Field(name);
    if (f == nullptr) return;
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_DOUBLE || !f->has_presence()) {
      return Mismatch(name, "an optional double (null when absent)");
    }
    if (v.has_value()) Refl()->SetDouble(out_, f, *v);
  }
  template <typename S>
  void operator()(const char* name, const S&, const char*) {
    // Nested objects and arrays stay in the trainer's own stream.
    if (Field(name) != nullptr) Mismatch(name, "an object or array");
  }

 private:
  const google::protobuf::Reflection* Refl() { return out_->GetReflection(); }
  const FieldDescriptor* Field(const char* name) {
    const FieldDescriptor* f = out_->GetDescriptor()->FindFieldByName(name);
    if (f != nullptr) written_->insert(name);
    return f;
  }
  void Mismatch(const char* name, const char* what) {
    mismatches_->push_back(absl::StrCat(name, ": the proto field cannot hold ", what));
  }

  google::protobuf::Message* out_;
  std::vector<std::string>* mismatches_;
  std::set<std::string>* written_;
};

const std::set<std::string>& Envelope() {
  static const auto* envelope = new std::set<std::string>{"type", "rank", "time"};
  return *envelope;
}

// The body field of v1::TrainerEvent for an event type: the oneof member named like
// it, nullptr for a type that is not relayed (buckets, trace) or not known.
const FieldDescriptor* BodyField(const std::string& type) {
  const FieldDescriptor* f = v1::TrainerEvent::descriptor()->FindFieldByName(type);
  if (f == nullptr || f->containing_oneof() == nullptr ||
      f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
    return nullptr;
  }
  return f;
}

// Reads event type E's fields through `reader` and copies them into `event`'s body for E,
// if the type has one.
template <typename E>
void ReadInto(v1::TrainerEvent* event, StructReader& reader) {
  E definition;
  E::Fields(definition, reader);
  const FieldDescriptor* body = BodyField(E::kType);
  if (body == nullptr) return;
  google::protobuf::Message* out = event->GetReflection()->MutableMessage(event, body);
  std::vector<std::string> mismatches;
  std::set<std::string> written;
  E::Fields(definition, ProtoWriter(out, &mismatches, &written));
}

}  // namespace

bool ParseTrainerEvent(const Struct& json, v1::TrainerEvent* event,
                       std::vector<std::string>* problems) {
  auto type_field = json.fields().find("type");
  if (type_field == json.fields().end() || !type_field->second.has_string_value() ||
      type_field->second.string_value().empty()) {
    return false;
  }
  const std::string& type = type_field->second.string_value();
  std::vector<std::string> ignored;
  std::vector<std::string>* out = problems != nullptr ? problems : &ignored;
  event->Clear();
  auto rank = json.fields().find("rank");
  auto time = json.fields().find("time");
  if (rank == json.fields().end() || !rank->second.has_number_value()) {
    out->push_back(absl::StrCat(type, ": missing field 'rank'"));
  } else {
    event->set_rank(static_cast<int32_t>(rank->second.number_value()));
  }
  if (time == json.fields().end() || !time->second.has_number_value()) {
    out->push_back(absl::StrCat(type, ": missing field 'time'"));
  } else {
    event->set_time(time->second.number_value());
  }
  bool known = false;
  ForEachEventType([&](auto definition) {
    using E = decltype(definition);
    if (known || type != E::kType) return;
    known = true;
    StructReader reader(json, E::kType, out);
    ReadInto<E>(event, reader);
    reader.ReportUnknown(Envelope());
  });
  if (!known) out->push_back(absl::StrCat("unknown event type '", type, "'"));
  return true;
}

bool ParseTrainerEvent(const std::string& line, v1::TrainerEvent* event,
                       std::vector<std::string>* problems) {
  if (line.empty() || line[0] != '{') return false;
  Struct json;
  if (!ParseJsonObject(line, &json).ok()) return false;
  return ParseTrainerEvent(json, event, problems);
}

ProgramLine ParseProgramEvent(const std::string& line, int rank, double now,
                              v1::TrainerEvent* event, std::string* why) {
  auto malformed = [&](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return ProgramLine::kMalformed;
  };
  if (line.empty() || line[0] != '{') return malformed("not a JSON object");
  Struct json;
  if (absl::Status parsed = ParseJsonObject(line, &json); !parsed.ok()) {
    return malformed(absl::StrCat("not valid JSON: ", parsed.message()));
  }
  auto type = json.fields().find("type");
  if (type == json.fields().end() || !type->second.has_string_value() ||
      type->second.string_value().empty()) {
    return malformed("no \"type\" string");
  }
  const std::string& name = type->second.string_value();
  event->Clear();
  // Whatever the program says, the rank is the one the worker started it as.
  event->set_rank(rank);
  auto time = json.fields().find("time");
  event->set_time(time != json.fields().end() && time->second.has_number_value()
                      ? time->second.number_value()
                      : now);
  if (name == "trace" || name == "buckets") return ProgramLine::kDropped;
  static const auto* kProgramTypes =
      new std::set<std::string>{"step", "epoch", "checkpoint", "error", "done", "recovered"};
  if (!kProgramTypes->count(name)) {
    return malformed(absl::StrCat("unknown type '", name,
                                  "' (step, epoch, checkpoint, error, done or recovered)"));
  }
  std::vector<std::string> problems;
  ForEachEventType([&](auto definition) {
    using E = decltype(definition);
    if (name != E::kType) return;
    StructReader reader(json, E::kType, &problems, /*lenient=*/true);
    ReadInto<E>(event, reader);
  });
  if (!problems.empty()) return malformed(problems.front());
  switch (event->body_case()) {
    case v1::TrainerEvent::kError:
      // A program's failure is worth a restart unless it says otherwise (torchrun's rule).
      if (!json.fields().count("retryable")) event->mutable_error()->set_retryable(true);
      break;
    case v1::TrainerEvent::kStep:
      if (!json.fields().count("loss")) return malformed("a step line needs \"loss\"");
      break;
    default:
      break;
  }
  return ProgramLine::kEvent;
}

std::string EventTypeName(const v1::TrainerEvent& event) {
  const google::protobuf::OneofDescriptor* body =
      v1::TrainerEvent::descriptor()->FindOneofByName("body");
  const FieldDescriptor* f = event.GetReflection()->GetOneofFieldDescriptor(event, body);
  return f == nullptr ? "" : f->name();
}

std::vector<std::string> TrainerEventProtoMismatches() {
  std::vector<std::string> mismatches;
  std::set<std::string> types;
  ForEachEventType([&](auto definition) {
    using E = decltype(definition);
    types.insert(E::kType);
    const FieldDescriptor* body = BodyField(E::kType);
    if (body == nullptr) return;  // Not relayed.
    v1::TrainerEvent scratch;
    google::protobuf::Message* out = scratch.GetReflection()->MutableMessage(&scratch, body);
    std::vector<std::string> found;
    std::set<std::string> written;
    E::Fields(definition, ProtoWriter(out, &found, &written));
    for (const std::string& m : found) mismatches.push_back(absl::StrCat(E::kType, ".", m));
    const google::protobuf::Descriptor* d = body->message_type();
    for (int i = 0; i < d->field_count(); ++i) {
      if (!written.count(d->field(i)->name())) {
        mismatches.push_back(
            absl::StrCat(E::kType, ".", d->field(i)->name(), ": the event type does not define it"));
      }
    }
  });
  const google::protobuf::OneofDescriptor* oneof =
      v1::TrainerEvent::descriptor()->FindOneofByName("body");
  for (int i = 0; i < oneof->field_count(); ++i) {
    if (!types.count(oneof->field(i)->name())) {
      mismatches.push_back(absl::StrCat(oneof->field(i)->name(), ": no event type of that name"));
    }
  }
  return mismatches;
}

}  // namespace ddp
