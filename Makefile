# The two commands of the README. Everything real lives in scripts/.
.PHONY: test demo build
test:
	scripts/test.sh
demo:
	scripts/demo.sh
build:
	scripts/setup.sh
