package agentsastools

// Topic exposes topic to the tests.
var Topic = topic

// FirstSentence exposes firstSentence to the tests.
var FirstSentence = firstSentence
