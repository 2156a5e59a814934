// Makes every string field of a protobuf message valid UTF-8 before it is sent.
//
// A proto3 `string` field holding invalid UTF-8 serializes (with a logged complaint)
// but fails to parse on the receiver, which then rejects the whole message: one
// Latin-1 byte in a trainer's error line made every batch of its agent bounce. The
// agent runs each outgoing request through RepairUtf8 (each invalid sequence becomes
// U+FFFD), so nothing it sends can be malformed that way.
#ifndef DDP_WORKER_AGENT_PROTO_UTF8_H_
#define DDP_WORKER_AGENT_PROTO_UTF8_H_

#include "google/protobuf/message.h"

namespace ddp {

// Repairs every string field, nested messages, repeated fields and map entries
// included. Returns the number of fields it changed.
int RepairUtf8(google::protobuf::Message* message);

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_PROTO_UTF8_H_
