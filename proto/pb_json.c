/*
 * See pb_json.h. Walks the protobuf-c descriptors, so every field of every
 * message converts without code of its own.
 */
#include "pb_json.h"

#include <string.h>

/* Enum values as the lower-case part of their name after the first '_'
 * (ENGINE_HOST -> "host"), which is how people name them. */
static json_t *pb_enum_json(const ProtobufCEnumDescriptor *ed, int value)
{
	const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(ed, value);
	if (!v)
		return json_integer(value);
	const char *name = strchr(v->name, '_');
	name = name ? name + 1 : v->name;
	char buf[64];
	size_t i;
	for (i = 0; name[i] && i + 1 < sizeof(buf); i++)
		buf[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] - 'A' + 'a' : name[i]);
	buf[i] = 0;
	return json_string(buf);
}

static size_t pb_type_size(ProtobufCType type)
{
	switch (type) {
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64: return 8;
	case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
	case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
	case PROTOBUF_C_TYPE_STRING:
	case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
	case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
	default: return 4; /* the 32-bit integers, float, enum */
	}
}

static json_t *pb_value_json(const ProtobufCFieldDescriptor *f, const void *p)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32: return json_integer(*(const int32_t *)p);
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32: return json_integer(*(const uint32_t *)p);
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64: return json_integer(*(const int64_t *)p);
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64: return json_integer((json_int_t) * (const uint64_t *)p);
	case PROTOBUF_C_TYPE_FLOAT: return json_real(*(const float *)p);
	case PROTOBUF_C_TYPE_DOUBLE: return json_real(*(const double *)p);
	case PROTOBUF_C_TYPE_BOOL: return json_boolean(*(const protobuf_c_boolean *)p);
	case PROTOBUF_C_TYPE_ENUM: return pb_enum_json(f->descriptor, *(const int *)p);
	case PROTOBUF_C_TYPE_STRING: {
		const char *s = *(char *const *)p;
		return json_string(s ? s : "");
	}
	case PROTOBUF_C_TYPE_BYTES: {
		const ProtobufCBinaryData *b = p;
		return json_integer((json_int_t)b->len); /* no query carries bytes; say how many */
	}
	case PROTOBUF_C_TYPE_MESSAGE: {
		const ProtobufCMessage *m = *(const ProtobufCMessage *const *)p;
		return m ? pb_json(m) : json_null();
	}
	}
	return json_null();
}

json_t *pb_field_json(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
	const char *field = (const char *)m + f->offset;
	if (f->label != PROTOBUF_C_LABEL_REPEATED)
		return pb_value_json(f, field);
	size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
	const char *elems = *(char *const *)field;
	json_t *a = json_array();
	for (size_t k = 0; k < n; k++)
		json_array_append_new(a, pb_value_json(f, elems + k * pb_type_size(f->type)));
	return a;
}

json_t *pb_json(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	json_t *o = json_object();
	for (unsigned i = 0; i < d->n_fields; i++)
		json_object_set_new(o, d->fields[i].name, pb_field_json(m, &d->fields[i]));
	return o;
}

