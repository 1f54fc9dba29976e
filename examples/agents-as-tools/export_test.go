package agentsastools

// Topic exposes topic to the tests.
var Topic = topic
