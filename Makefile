# The two commands of the README. Everything real lives in scripts/.
.PHONY: test demo build images
test:
	scripts/test.sh
demo:
	scripts/demo.sh
build:
	scripts/setup.sh
images:
	scripts/images.sh
