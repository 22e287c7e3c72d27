// Command static is a program built static by TestPathFindsTheAgentOnPATH.
package main

func main() {}
