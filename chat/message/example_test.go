package message_test

import (
	"encoding/json"
	"fmt"

	"github.com/agentry/agentry/chat/message"
)

func ExampleBuilder() {
	b := message.NewBuilder("asst-1")
	for _, c := range []message.Chunk{
		message.Start("asst-1"),
		message.StartStep(),
		message.ToolInputAvailable("call_1", "getWeather", json.RawMessage(`{"city":"Paris"}`)),
		message.ToolOutputAvailable("call_1", json.RawMessage(`{"tempC":21}`)),
		message.FinishStep(),
		message.StartStep(),
		message.TextStart("t1"),
		message.TextDelta("t1", "It is 21°C in Paris."),
		message.TextEnd("t1"),
		message.FinishStep(),
		message.Finish("stop"),
	} {
		if err := b.Apply(c); err != nil {
			fmt.Println(err)
			return
		}
	}
	out, _ := json.Marshal(b.Message())
	fmt.Println(string(out))
	// Output:
	// {"id":"asst-1","role":"assistant","metadata":{"finishReason":"stop"},"parts":[{"type":"step-start"},{"type":"tool-getWeather","toolCallId":"call_1","state":"output-available","input":{"city":"Paris"},"output":{"tempC":21}},{"type":"step-start"},{"type":"text","text":"It is 21°C in Paris.","state":"done"}]}
}

func ExampleBuilder_Apply_orderingError() {
	b := message.NewBuilder("m")
	err := b.Apply(message.TextDelta("t1", "hello"))
	fmt.Println(err)
	// Output:
	// message: text-delta chunk "t1": no open text part with this id; send text-start first
}

func ExampleToModel() {
	msgs := []message.Message{
		{ID: "s", Role: message.RoleSystem, Parts: []message.Part{{Type: message.PartText, Text: "Be brief."}}},
		{ID: "u", Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: "Hi"}}},
	}
	system, conv := message.ToModel(msgs)
	fmt.Printf("%q %d %s\n", system, len(conv), conv[0].Role)
	// Output:
	// "Be brief." 1 user
}
