package daemon

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Codecs that refuse unknown fields. connect-go's own codecs drop them, so a typo
// ("memroy": "4g") or a field this roched does not know yet (from a newer client) was
// silently ignored and the sandbox made without it: weaker than asked, with no word.
// Answers in JSON carry every scalar field, zeros included: "exitCode": 0 is an answer,
// where an absent field leaves a client guessing.
func strictCodecs() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(strictJSON{"json"}),
		connect.WithCodec(strictJSON{"json; charset=utf-8"}),
		connect.WithCodec(strictProto{}),
	}
}

type strictJSON struct{ name string }

func (c strictJSON) Name() string { return c.name }

func (strictJSON) IsBinary() bool { return false }

func (strictJSON) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return protojson.MarshalOptions{EmitDefaultValues: true}.Marshal(pm)
}

// MarshalAppend: see strictProto's.
func (strictJSON) MarshalAppend(b []byte, m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return protojson.MarshalOptions{EmitDefaultValues: true}.MarshalAppend(b, pm)
}

func (strictJSON) Unmarshal(b []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", m)
	}
	if len(b) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	// protojson's error names the field: `unknown field "memroy"`.
	if err := (protojson.UnmarshalOptions{}).Unmarshal(b, pm); err != nil {
		return fmt.Errorf("%v (fields are named as in roche.v1's .proto, in lowerCamelCase or snake_case)", err)
	}
	return nil
}

type strictProto struct{}

func (strictProto) Name() string { return "proto" }

func (strictProto) IsBinary() bool { return true }

func (strictProto) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return proto.Marshal(pm)
}

// MarshalAppend lets connect-go marshal into a buffer from its pool. Without it each
// message is a new buffer that connect-go then puts in its pool, which held every chunk
// of a stream sent between two collections: a 1 GiB read took roched's heap to its soft
// limit.
func (strictProto) MarshalAppend(b []byte, m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return proto.MarshalOptions{}.MarshalAppend(b, pm)
}

func (strictProto) Unmarshal(b []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", m)
	}
	if err := proto.Unmarshal(b, pm); err != nil {
		return err
	}
	return unknownFields(pm.ProtoReflect())
}

// unknownFields reports the first field, anywhere in m, that this roched's schema does
// not have.
func unknownFields(m protoreflect.Message) error {
	if raw := m.GetUnknown(); len(raw) > 0 {
		num, _, _ := protowire.ConsumeTag(raw)
		return fmt.Errorf("unknown field number %d in %s: the client is newer than this roched, which would ignore it; upgrade roched",
			num, m.Descriptor().FullName())
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = unknownFields(l.Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				err = unknownFields(mv.Message())
				return err == nil
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			err = unknownFields(v.Message())
		}
		return err == nil
	})
	return err
}
