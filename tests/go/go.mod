module berth/tests/go

go 1.20

require github.com/rabbitmq/amqp091-go v1.16.0
