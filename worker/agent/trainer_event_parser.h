// The agent's side of the event contract (common/contract/events.h): parses
// one line from a trainer's event pipe, checks it against the definition of its type
// field by field, and maps it into v1::TrainerEvent: the envelope, and the type's
// fields into the body message named like the type, by field name.
//
// Strict but forgiving: an unknown field, a missing one or one of the wrong type is
// reported in `problems` (the agent logs each kind once; the contract tests require
// none), and the event is still relayed with what could be read, so that a newer or
// older trainer keeps working.
#ifndef DDP_WORKER_AGENT_TRAINER_EVENT_PARSER_H_
#define DDP_WORKER_AGENT_TRAINER_EVENT_PARSER_H_

#include <string>
#include <vector>

#include "ddp/v1/types.pb.h"
#include "google/protobuf/struct.pb.h"

namespace ddp {

// False if `line` is not a JSON object with a string "type" (then it is plain
// output). Otherwise fills `event` with the envelope and, for a relayed type, the
// body with every field it has (`buckets`, `trace` and unknown types get no body),
// and appends to `problems` (if given) what did not match the definition:
// "step: missing field 'loss'", "step: unknown field 'extra'", "unknown event type 'x'".
bool ParseTrainerEvent(const std::string& line, v1::TrainerEvent* event,
                       std::vector<std::string>* problems = nullptr);
// The same for an already parsed JSON object.
bool ParseTrainerEvent(const google::protobuf::Struct& json, v1::TrainerEvent* event,
                       std::vector<std::string>* problems = nullptr);

// A user's program (a command job) writes event lines too (docs/command-jobs.md), and they
// are read leniently: every field but `type` is optional (a `step` needs `loss`),
// unknown fields are ignored, `rank` is the one the worker started the process as
// (whatever the line says) and `time` defaults to `now`. A line that is not a JSON
// object with a known `type`, or whose known fields have the wrong types, is
// kMalformed (`why` says how); `trace` and `buckets` lines are kDropped (they stay
// local, as the trainer's do).
enum class ProgramLine { kEvent, kDropped, kMalformed };
ProgramLine ParseProgramEvent(const std::string& line, int rank, double now,
                              v1::TrainerEvent* event, std::string* why);

// The event type of `event`'s body ("step", ...), "" when it has none.
std::string EventTypeName(const v1::TrainerEvent& event);

// Where v1::TrainerEvent's bodies and the definitions disagree: a body field its
// event type does not define, or defines with a type the proto cannot hold, or a
// body named like no event type. Each is "<type>.<field>: <why>" or "<body>: <why>".
// Empty when the proto and the definitions agree.
std::vector<std::string> TrainerEventProtoMismatches();

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_TRAINER_EVENT_PARSER_H_
