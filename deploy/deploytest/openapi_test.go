package deploytest

func checkOpenAPI(t interface{ Helper() }, s *stack) {}
