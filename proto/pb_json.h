/*
 * Protocol messages as JSON, from their protobuf-c descriptors: the one
 * conversion behind every `--json` of dfcclctl and the flight-recorder files
 * dfccld writes, so a message has a single JSON form wherever it appears.
 * Objects are keyed by the proto field names; repeated fields are arrays;
 * enum values are the lower-case part of their name after the first '_'
 * (ENGINE_HOST -> "host"); bytes fields give their length.
 */
#ifndef DFCCL_PB_JSON_H
#define DFCCL_PB_JSON_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

/* A message as a JSON object (a new reference). */
json_t *pb_json(const ProtobufCMessage *m);

/* One field of m: a value, or an array for a repeated field. */
json_t *pb_field_json(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f);

#endif
