#include "worker/agent/proto_utf8.h"

#include <string>
#include <vector>

#include "common/utf8.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"

namespace ddp {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

int RepairUtf8(Message* message) {
  const Reflection* refl = message->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  refl->ListFields(*message, &fields);  // Set fields only (oneof members included).
  int repaired = 0;
  std::string scratch;
  for (const FieldDescriptor* f : fields) {
    const bool is_string = f->type() == FieldDescriptor::TYPE_STRING;
    const bool is_message = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (!is_string && !is_message) continue;  // `bytes` may hold anything.
    if (f->is_repeated()) {
      const int n = refl->FieldSize(*message, f);
      for (int i = 0; i < n; ++i) {
        if (is_message) {
          repaired += RepairUtf8(refl->MutableRepeatedMessage(message, f, i));
          continue;
        }
        const std::string& s = refl->GetRepeatedStringReference(*message, f, i, &scratch);
        if (IsValidUtf8(s)) continue;
        refl->SetRepeatedString(message, f, i, ToValidUtf8(s));
        ++repaired;
      }
    } else if (is_message) {
      repaired += RepairUtf8(refl->MutableMessage(message, f));
    } else {
      const std::string& s = refl->GetStringReference(*message, f, &scratch);
      if (IsValidUtf8(s)) continue;
      refl->SetString(message, f, ToValidUtf8(s));
      ++repaired;
    }
  }
  return repaired;
}

}  // namespace ddp
