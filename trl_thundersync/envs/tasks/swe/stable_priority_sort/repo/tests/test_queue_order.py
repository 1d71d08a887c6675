from queue_order import Ticket, order_tickets


def ids(tickets):
    return [t.ident for t in tickets]


def test_distinct_priorities():
    tickets = [Ticket("a", 3), Ticket("b", 1), Ticket("c", 2)]
    assert ids(order_tickets(tickets)) == ["b", "c", "a"]


def test_equal_priorities_keep_arrival_order():
    tickets = [Ticket("a", 2), Ticket("b", 2), Ticket("c", 1), Ticket("d", 2), Ticket("e", 1)]
    assert ids(order_tickets(tickets)) == ["c", "e", "a", "b", "d"]


def test_input_not_modified():
    tickets = [Ticket("a", 2), Ticket("b", 1)]
    order_tickets(tickets)
    assert ids(tickets) == ["a", "b"]
